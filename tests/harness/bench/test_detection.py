"""The detection trade-off is replayed over recorded stores: a setting that finds the fault
reports its seconds, one that does not before the live fix says so, and a healthy soak's
incidents count as false alarms per hour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiops.analytics.traces import TraceThresholds
from aiops.config import Settings
from aiops.store import Store
from aiops_harness.bench.detection import SETTINGS, sweep
from tests.aiops.analytics.telemetry import NS, T0, add_spans, span, traffic

pytestmark = pytest.mark.slow


def test_replayed_settings_give_mttd_and_false_alarms(tmp_path: Path) -> None:
    store = Store(tmp_path / "demo-1.duckdb")
    traffic(store, T0 - 300 * NS, 300, 1, 50, version="v1")
    traffic(store, T0, 60, 1, 50, version="v1")
    # A canary from T0 whose first two requests take 3 s: the tail test has them at ~T0+5.
    add_spans(store, [span(T0 + 1 * NS, 3000, version="v2"),
                      span(T0 + 2 * NS, 3000, version="v2")])
    store.close()
    (tmp_path / "demo-1.json").write_text(json.dumps([
        {"scenario": "canary", "model": "echo", "version": "v2", "fault_at": T0 / NS,
         "fixed_at": T0 / NS + 6}]))
    soak = Store(tmp_path / "soak.duckdb")
    traffic(soak, T0 - 120 * NS, 240, 1, 50, version="v1")
    soak.close()
    (tmp_path / "soak.json").write_text(json.dumps({"start": T0 / NS, "end": T0 / NS + 60}))

    defaults = "defaults (tail test, alpha 1e-3, 10 s window, 1 s rounds)"
    grid = {defaults: SETTINGS[defaults],
            "shift test only, 10 s window, 1 s rounds": (1.0, TraceThresholds(tail_min=10**9))}
    rows = {r.setting: r for r in sweep(tmp_path, Settings(data_dir=tmp_path / "d"),
                                        soak_minutes=1, grid=grid, horizon_s=15)}
    [(mttd, fixed)] = rows[defaults].mttd_s["canary"]
    assert mttd is not None and 4 <= mttd <= 6 and fixed == 6
    [(shift_only, _)] = rows["shift test only, 10 s window, 1 s rounds"].mttd_s["canary"]
    assert shift_only is None  # two spans are below the shift test's five
    assert all(r.false_per_hour == 0 and r.soak_minutes == 1 for r in rows.values())

"""SLO burn rate: multi-window, per model version, from the ingress spans."""

from __future__ import annotations

import pytest

from aiops.analytics.findings import FaultClass
from aiops.analytics.slo import BurnWindow, Objective, burn_findings, parse_windows
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, traffic

WINDOWS = [BurnWindow(60, 10, 6.0)]
ECHO = Objective("echo", latency_ms=100, latency_budget=0.05, error_budget=0.01)


def test_within_objective_nothing_burns(store: Store) -> None:
    traffic(store, T0 - 60 * NS, 60, 5, 50)
    assert burn_findings(store, [ECHO], WINDOWS, T0) == []


def test_slow_requests_burn_the_latency_budget(store: Store) -> None:
    traffic(store, T0 - 60 * NS, 40, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 300, version="v1")
    found = burn_findings(store, [ECHO], WINDOWS, T0)
    assert [(f.entity.version, f.fault_class) for f in found] == [("v1", FaultClass.LATENCY)]
    assert "burning the error budget" in found[0].summary


def test_errors_burn_the_error_budget_of_their_version_only(store: Store) -> None:
    traffic(store, T0 - 60 * NS, 60, 5, 50, version="v1")
    traffic(store, T0 - 15 * NS, 15, 2, 50, version="v2", status=503)
    found = {(f.entity.version, f.fault_class) for f in burn_findings(store, [ECHO], WINDOWS, T0)}
    assert found == {("v2", FaultClass.ERRORS)}


def test_the_short_window_stops_the_alert_after_recovery(store: Store) -> None:
    traffic(store, T0 - 60 * NS, 40, 5, 300)  # slow, then fine for the last 20 s
    traffic(store, T0 - 20 * NS, 20, 5, 50)
    assert burn_findings(store, [ECHO], WINDOWS, T0) == []


def test_window_pairs_parse_and_bad_ones_are_refused() -> None:
    assert parse_windows("60/10/6, 600/60/3") == [BurnWindow(60, 10, 6), BurnWindow(600, 60, 3)]
    with pytest.raises(ValueError, match="short < long"):
        parse_windows("10/60/6")

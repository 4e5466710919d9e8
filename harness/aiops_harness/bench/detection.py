"""Detection at the shipped defaults: the demo's MTTD and recovery over repeated runs, the
false-alarm side (a healthy soak under the same traffic), and the trade-off between the two for
other detector settings, replayed over the recorded telemetry.

Each demo run and the soak keep a copy of their telemetry store (``keep_dir``). ``sweep``
replays the live analyzer over those copies, round by round at each setting's own interval,
and reports per setting the seconds from each fault to the first incident on the faulty model
version, and the incidents the healthy soak would have opened per hour. A replay sees a span
at its end time, not when it was exported (about a second later live), so replayed MTTDs are
a little shorter than live ones; the comparison between settings is what it is for.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.slo import parse_windows
from aiops.analytics.traces import TraceThresholds
from aiops.config import Settings
from aiops.store import Store
from serve.specs import objectives_from_specs

__all__ = ["DemoRun", "SoakResult", "SweepRow", "demo_runs", "soak", "sweep"]

NS = 1_000_000_000
STORE = "telemetry.duckdb"
WARMUP_S = 45.0  # as the demo's baseline: the stack has just loaded its models


@dataclass
class DemoRun:
    scenario: str
    mttd_s: float | None
    ttr_s: float | None
    attributed: bool
    action: str
    fault_at: float
    store: Path | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.attributed and self.mttd_s is not None and self.ttr_s is not None \
            and not self.problems


def _keep_store(settings: Settings, dest: Path) -> Path | None:
    src = settings.data_dir / STORE
    if not src.exists():
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    wal = src.with_suffix(src.suffix + ".wal")
    if wal.exists():
        shutil.copyfile(wal, dest.with_suffix(dest.suffix + ".wal"))
    return dest


def demo_runs(base: Settings, scenarios: list[str], runs: int, keep_dir: Path,
              progress: Callable[[str], None] = lambda _: None) -> list[list[DemoRun]]:
    """``runs`` demos of ``scenarios`` (each a fresh stack at the defaults)."""
    from aiops.errors import AIOpsError
    from aiops_harness.demo.runner import demo_settings, run_demo

    out = []
    for i in range(runs):
        settings = demo_settings(base)
        quiet = Console(file=io.StringIO(), width=120)
        progress(f"demo run {i + 1}/{runs}: {', '.join(scenarios)}")
        try:
            results = run_demo(settings, quiet, scenarios, keep_dir / f"report-{i + 1}",
                               headless=True)
        except AIOpsError as exc:
            out.append([DemoRun(scenarios[0], None, None, False, "-", 0.0, None, [str(exc)])])
            progress(f"  failed: {exc}")
            continue
        stored = _keep_store(settings, keep_dir / f"demo-{i + 1}.duckdb")
        this = []
        for r in results:
            act = f"{r.action['kind']} ({r.action['status']})" if r.action else \
                ("operator fix" if r.fixed_at else "-")
            this.append(DemoRun(r.scenario.name, r.mttd_s, r.ttr_s, r.attributed, act,
                                r.fault_at, stored, list(r.problems)))
            progress(f"  {r.scenario.name}: MTTD {r.mttd_s or 0:.1f} s, recovered "
                     f"{r.ttr_s or 0:.1f} s, attributed {r.attributed}")
        if stored is not None:
            faults = [{"scenario": r.scenario.name, "model": r.scenario.model,
                       "version": r.scenario.version, "fault_at": r.fault_at,
                       "fixed_at": r.acted_at or r.fixed_at} for r in results]
            stored.with_suffix(".json").write_text(json.dumps(faults, indent=1))
        out.append(this)
    return out


@dataclass
class SoakResult:
    minutes: float
    warmup_incidents: list[str]
    incidents: list[str]  # opened after the warm-up: false alarms, the traffic being healthy
    requests: int
    failed_requests: int
    store: Path | None

    @property
    def per_hour(self) -> float:
        return len(self.incidents) / (self.minutes / 60) if self.minutes else 0.0


def soak(base: Settings, minutes: float, keep_dir: Path,
         progress: Callable[[str], None] = lambda _: None) -> SoakResult:
    """The demo's stack and mixed traffic for ``minutes`` with no fault injected."""
    from aiops.client import ServerClient
    from aiops.stack import down, up
    from aiops_harness.demo.runner import demo_settings
    from aiops_harness.demo.traffic import Traffic

    settings = demo_settings(base)
    if settings.data_dir.is_dir():
        shutil.rmtree(settings.data_dir)
    up(settings, progress=progress)
    traffic = None
    try:
        traffic = Traffic(settings.serve_url, api_key=next(
            (k.strip() for k in settings.api_keys.split(",") if k.strip()), None)).start()
        started = time.time()
        time.sleep(WARMUP_S)
        steady = time.time()
        deadline = steady + minutes * 60
        while time.time() < deadline:
            time.sleep(min(30.0, max(0.0, deadline - time.time())))
            progress(f"soak: {(time.time() - steady) / 60:.1f} of {minutes:g} min")
        with ServerClient.of(settings) as db:
            rows = db.rows("SELECT incident_id, epoch_ns(min(updated_at)) / 1e9 AS t, "
                           "arg_min(summary, updated_at) AS summary FROM incidents "
                           "GROUP BY incident_id ORDER BY t", [])
        samples = [s for s in list(traffic.samples) if s.end >= started]
    finally:
        if traffic is not None:
            traffic.close()
        down(settings, progress=progress)
    stored = _keep_store(settings, keep_dir / "soak.duckdb")
    if stored is not None:
        stored.with_suffix(".json").write_text(json.dumps(
            {"start": steady, "end": deadline}, indent=1))
    return SoakResult(minutes, [f"{r['incident_id']}: {r['summary']}" for r in rows
                                if r["t"] < steady],
                      [f"{r['incident_id']}: {r['summary']}" for r in rows if r["t"] >= steady],
                      len(samples), sum(s.status != 200 for s in samples), stored)


# Settings replayed by ``sweep``: the earlier defaults (median shift only, 20 s window, 5 s
# rounds), the defaults now, and neighbours of them.
SETTINGS: dict[str, tuple[float, TraceThresholds]] = {
    "earlier defaults (shift test only, 20 s window, 5 s rounds)":
        (5.0, TraceThresholds(window_s=20, tail_min=10**9)),
    "shift test only, 10 s window, 1 s rounds": (1.0, TraceThresholds(window_s=10,
                                                                      tail_min=10**9)),
    "defaults (tail test, alpha 1e-3, 10 s window, 1 s rounds)":
        (1.0, TraceThresholds(window_s=10)),
    "tail alpha 1e-2": (1.0, TraceThresholds(window_s=10, tail_alpha=1e-2)),
    "tail alpha 1e-4": (1.0, TraceThresholds(window_s=10, tail_alpha=1e-4)),
    "tail test, 20 s window": (1.0, TraceThresholds(window_s=20)),
    "defaults without the SLO floor": (1.0, TraceThresholds(window_s=10, slo_floor=False)),
}


@dataclass
class SweepRow:
    setting: str
    # scenario -> per recorded run: seconds to detection, or None when not detected before
    # the live run's fix (after which the fault left no more evidence), with that fix time
    mttd_s: dict[str, list[tuple[float | None, float | None]]]
    false_per_hour: float | None
    soak_minutes: float = 0.0


def _changes(store_path: Path, config: AnalyzerConfig, start_ns: int, end_ns: int
             ) -> list[tuple[int, dict[str, Any]]]:
    """(round time, incident row) for every change to an active incident over the period."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / STORE
        shutil.copyfile(store_path, copy)
        wal = store_path.with_suffix(store_path.suffix + ".wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_suffix(copy.suffix + ".wal"))
        store = Store(copy)
        try:
            analyzer = Analyzer(store, config)
            out = []
            now = start_ns
            while now <= end_ns:
                out += [(now, inc.row()) for inc in analyzer.step(now)
                        if inc.status != "resolved"]
                now += int(config.interval_s * NS)
        finally:
            store.close()
    return out


def sweep(keep_dir: Path, settings: Settings, soak_minutes: float = 10.0,
          progress: Callable[[str], None] = lambda _: None,
          grid: dict[str, tuple[float, TraceThresholds]] | None = None,
          horizon_s: float = 120.0) -> list[SweepRow]:
    """Replays every setting over the demo stores and the first ``soak_minutes`` of the soak
    (each round costs tens of ms, and six settings over 30 minutes of 1 s rounds are more
    than the rest of the bench)."""
    base = AnalyzerConfig(windows=tuple(parse_windows(settings.analytics_burn_windows)),
                          resolve_after_s=10.0, objectives=objectives_from_specs(None),
                          own_ports=(settings.server_port,))
    demos = sorted(keep_dir.glob("demo-*.duckdb"))
    soak_store = keep_dir / "soak.duckdb"
    rows = []
    for name, (interval, thresholds) in (grid or SETTINGS).items():
        config = replace(base, interval_s=interval, traces=thresholds)
        progress(f"replaying: {name}")
        mttd: dict[str, list[tuple[float | None, float | None]]] = {}
        for path in demos:
            faults = json.loads(path.with_suffix(".json").read_text())
            for i, f in enumerate(faults):
                start = int((f["fault_at"] - (WARMUP_S if i == 0 else 5)) * NS)
                changes = _changes(path, config, start, int((f["fault_at"] + horizon_s) * NS))
                hit = next((t for t, row in changes if t >= f["fault_at"] * NS
                            and row["service"] == f["model"]
                            and row["model_version"] == f["version"]), None)
                fixed = f.get("fixed_at")
                mttd.setdefault(f["scenario"], []).append(
                    (None if hit is None else hit / NS - f["fault_at"],
                     None if fixed is None else fixed - f["fault_at"]))
        per_hour, minutes = None, 0.0
        if soak_store.exists():
            period = json.loads(soak_store.with_suffix(".json").read_text())
            period["end"] = min(period["end"], period["start"] + soak_minutes * 60)
            minutes = (period["end"] - period["start"]) / 60
            # From the stack's start, so the detectors have their history; counted from the
            # end of the warm-up, as live.
            changes = _changes(soak_store, config, int((period["start"] - WARMUP_S) * NS),
                               int(period["end"] * NS))
            first: dict[str, int] = {}
            for t, row in changes:
                first.setdefault(row["incident_id"], t)
            n = sum(t >= period["start"] * NS for t in first.values())
            per_hour = n / ((period["end"] - period["start"]) / 3600)
        rows.append(SweepRow(name, mttd, per_hour, minutes))
    return rows

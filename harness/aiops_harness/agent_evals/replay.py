"""Replay a case through the live analyzer, round by round, as the aiops server would have.

The caller loads the case's telemetry into a store first (``cases.load_telemetry``). ``replay``
then runs the real :class:`~aiops.analytics.engine.Analyzer` with the case's SLOs and otherwise
default settings, one round every ``step_s`` seconds from a minute after the earliest telemetry
up to the moment the question is asked (the last round exactly then).

The live server never holds telemetry from after the current round, and some detector queries
rely on that (the eBPF ones have no upper time bound). So the rounds run against a private
in-memory store that receives each row when it would have arrived (a span when it ended, a log
record when it was observed, a metric point at its time); at the end the incidents written go
into the caller's store, beside the telemetry, where the agent's tools find them.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass

import pyarrow as pa

from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.findings import Finding
from aiops.analytics.incidents import rank_causes, symptom_of
from aiops.analytics.slo import SLO_BURN
from aiops.store import Store
from aiops_harness.agent_evals.cases import TELEMETRY_TABLES, Case, load_telemetry

__all__ = ["FINDING", "WARMUP_S", "IncidentSummary", "expected_incident", "replay",
           "replay_case", "round_times", "summarize_held", "summarize_incidents"]

NS = 1_000_000_000
FINDING = "finding"  # the status of a summary of held findings (not an incident)
WARMUP_S = 60.0  # the first round runs this long after the earliest telemetry

# When a row reaches the server, and the time it is about.
_ARRIVAL = {"spans": ("coalesce(end_time, start_time)", "start_time"),
            "logs": ("coalesce(observed_time, time)", "time"),
            "metric_points": ("time", "time")}


def round_times(earliest_ns: int | None, now_ns: int, step_s: float = 5.0) -> list[int]:
    """When the rounds run: every ``step_s`` from ``earliest + WARMUP_S``, the last at now."""
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    step = int(step_s * NS)
    t = now_ns if earliest_ns is None else min(earliest_ns + int(WARMUP_S * NS), now_ns)
    out = []
    while t < now_ns:
        out.append(t)
        t += step
    return [*out, now_ns]


class _Feed:
    """One table's rows in arrival order, handed out up to a time."""

    def __init__(self, store: Store, name: str) -> None:
        arrival, about = _ARRIVAL[name]
        data = store.query_arrow(
            f"SELECT *, epoch_ns({arrival}) AS _arrival, epoch_ns({about}) AS _about "
            f"FROM {name} ORDER BY _arrival")
        self.name = name
        self.arrivals: list[int] = data.column("_arrival").to_pylist()
        abouts = [t for t in data.column("_about").to_pylist() if t is not None]
        self.earliest: int | None = min(abouts) if abouts else None
        self.rows: pa.Table = data.drop_columns(["_arrival", "_about"])
        self.sent = 0

    def until(self, t_ns: int) -> pa.Table | None:
        end = bisect_right(self.arrivals, t_ns)
        if end <= self.sent:
            return None
        out = self.rows.slice(self.sent, end - self.sent)
        self.sent = end
        return out


def replay(case: Case, store: Store, step_s: float = 5.0,
           held: dict[tuple[str, str, str], Finding] | None = None) -> Analyzer:
    """Run the analyzer over the telemetry in ``store`` up to ``case.now``; the incidents it
    wrote are appended to ``store``. Returns the analyzer (its tracker holds the incidents
    still open at the end; its ``store`` is ``store``)."""
    now_ns = case.now_ns
    feeds = [_Feed(store, name) for name in TELEMETRY_TABLES]
    starts = [f.earliest for f in feeds if f.earliest is not None]
    live = Store(None)
    try:
        analyzer = Analyzer(live, AnalyzerConfig(interval_s=step_s,
                                                 objectives=case.analyzer_objectives()),
                            clock=lambda: now_ns)
        for t in round_times(min(starts) if starts else None, now_ns, step_s):
            batches = {f.name: b for f in feeds if (b := f.until(t)) is not None}
            if batches:
                live.append_many(batches)  # one transaction, as one ingest flush
            analyzer.step(t)
            if held is not None:  # every finding held (not paged) in any round
                for f in analyzer.tracker.held():
                    key = (f.detector, str(f.entity), str(f.fault_class))
                    if key not in held or held[key].start_ns > f.start_ns:
                        held[key] = f
        incidents = live.query_arrow("SELECT * FROM incidents ORDER BY updated_at")
    finally:
        live.close()
    if incidents.num_rows:
        store.append("incidents", incidents)
    analyzer.store = store
    return analyzer


@dataclass(frozen=True)
class IncidentSummary:
    """One incident as the replay left it: the top root cause of its latest state, and the
    onset its evidence gave when it was opened (later states can move it: see the notes)."""

    incident_id: str
    service: str
    status: str
    opened_ns: int
    onset_ns: int  # evidence onset_ns of the first row
    latest_onset_ns: int  # evidence onset_ns of the latest row
    cause_service: str | None
    cause_version: str | None
    cause_replica: str | None
    fault_class: str | None
    confidence: float


def summarize_incidents(store: Store) -> list[IncidentSummary]:
    """Every incident in ``store``, by when it opened."""
    rows = store.query("SELECT incident_id, service, status, epoch_ns(opened_at), evidence "
                       "FROM incidents ORDER BY updated_at").rows
    first: dict[str, int] = {}
    latest: dict[str, tuple[str, str, int, dict[str, object]]] = {}
    for incident_id, service, status, opened_ns, evidence in rows:
        ev = json.loads(evidence)
        first.setdefault(incident_id, int(ev["onset_ns"]))
        latest[incident_id] = (service, status, int(opened_ns), ev)
    out = []
    for incident_id, (service, status, opened_ns, ev) in latest.items():
        causes = ev.get("root_causes") or [{}]
        top = causes[0] if isinstance(causes, list) and causes else {}
        out.append(IncidentSummary(
            incident_id, service, status, opened_ns, first[incident_id], int(str(ev["onset_ns"])),
            top.get("service"), top.get("version"), top.get("replica"), top.get("fault_class"),
            float(top.get("confidence") or 0.0)))
    return sorted(out, key=lambda i: (i.opened_ns, i.incident_id))


def expected_incident(case: Case, incidents: list[IncidentSummary], tolerance_s: float = 60.0
                      ) -> IncidentSummary | None:
    """The incident that states the case's expected facts: its top cause is the expected
    component (and version, fault class, replica where the case names them) and its onset is
    within ``tolerance_s`` of the expected one. None when there is none (or, for a case that
    expects no incident, always)."""
    e = case.expect
    if e.component is None:
        return None
    for inc in incidents:
        if inc.cause_service != e.component or inc.fault_class != (e.fault_class or
                                                                   inc.fault_class):
            continue
        if inc.cause_version != e.version or (e.replica and inc.cause_replica != e.replica):
            continue
        onset = case.onset_ns
        if onset is not None and abs(inc.onset_ns - onset) > tolerance_s * NS:
            continue
        return inc
    return None


def summarize_held(held: list[Finding], analyzer: Analyzer) -> list[IncidentSummary]:
    """What the analyzer found that was not a page (``IncidentTracker.held``: CPU contention
    within the SLO, retransmits, a flood of invalid requests), one summary per service,
    ranked as an incident would be; status ``finding``."""
    by_service: dict[str, list[Finding]] = {}
    for f in held:
        by_service.setdefault(f.subject, []).append(f)
    out = []
    for service, fs in sorted(by_service.items()):
        top = rank_causes(fs, analyzer.tracker.calls, symptom_of(fs))[0]
        onset = min((f.start_ns for f in fs if f.detector != SLO_BURN),
                    default=min(f.start_ns for f in fs))
        out.append(IncidentSummary(
            f"finding:{service}", service, FINDING, onset, onset, onset, top.entity.service,
            top.entity.version, top.entity.replica, str(top.fault_class), top.confidence))
    return out


def replay_case(case: Case, step_s: float = 5.0) -> list[IncidentSummary]:
    """Load the case into a fresh in-memory store, replay it, and summarise the incidents
    (pages) and, after them, the findings held at the end (not pages)."""
    store = Store(None)
    try:
        load_telemetry(case, store)
        held: dict[tuple[str, str, str], Finding] = {}
        analyzer = replay(case, store, step_s, held)
        return summarize_incidents(store) + summarize_held(list(held.values()), analyzer)
    finally:
        store.close()

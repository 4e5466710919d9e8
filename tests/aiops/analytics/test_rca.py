"""Root-cause ranking, specified on small synthetic tables written through the real Store.

A three-tier system -- gateway -> api -> model, each call a client span in the caller and a
server span in the callee -- serves a steady trickle of requests for half an hour (the
baseline), then for five minutes (the anomaly window) one thing goes wrong.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from aiops.analytics.rca import EvidenceKind, FaultClass, RankConfig, Window, rank
from aiops.store import Store

T0 = datetime(2024, 1, 1, tzinfo=UTC)
BASELINE = Window(T0, T0 + timedelta(minutes=30))
ANOMALY = Window(T0 + timedelta(minutes=30), T0 + timedelta(minutes=35))
SERVICES = ("gateway", "api", "model")


def ns(t: datetime) -> int:
    return int(t.timestamp() * 1e9)


@dataclass
class Knobs:
    """What the system does in one request; the defaults are its normal behaviour."""

    model_ms: float = 20.0  # the model's own work
    api_ms: float = 3.0
    gateway_ms: float = 1.0
    network_ms: float = 1.0  # per hop, each way
    replica_ms: dict[str, float] = field(default_factory=dict)  # model time per replica
    version_ms: dict[str, float] = field(default_factory=dict)  # model time per version
    api_fails: bool = False  # the api hits an error path instead of calling the model
    model_down: bool = False  # the model answers nothing; the api's call to it errors
    # Failures marked as HTTP 5xx with no error status (as HTTP instrumentation and proxies
    # leave them) rather than as an error status.
    http_5xx: bool = False


class Telemetry:
    """Rows for spans, logs and metric points, appended to a store in one go."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.rng = random.Random(7)

    def span(self, trace: str, parent: str | None, service: str, name: str, start: float,
             ms: float, replica: str | None = None, error: bool = False,
             version: str | None = None, http_5xx: bool = False) -> str:
        span_id = f"{self.rng.getrandbits(64):016x}"
        attrs = {"service.name": service, "service.instance.id": replica or f"{service}-0"}
        own: dict[str, Any] = {"aiops.model.version": version} if version else {}
        if error and http_5xx:
            own["http.response.status_code"], error = 503, False
        self.spans.append({
            "attributes": json.dumps(own),
            "trace_id": trace, "span_id": span_id, "parent_span_id": parent, "name": name,
            "start_time": int(start), "end_time": int(start + ms * 1e6),
            "duration_ns": int(ms * 1e6), "status_code": "error" if error else "unset",
            "service_name": service, "resource_attributes": json.dumps(attrs)})
        return span_id

    def log(self, trace: str, span: str, service: str, t: float, body: str,
            severity: int = 9) -> None:
        self.logs.append({
            "time": int(t), "trace_id": trace, "span_id": span, "body": body,
            "severity_number": severity, "severity_text": "ERROR" if severity >= 17 else "INFO",
            "service_name": service,
            "resource_attributes": json.dumps({"service.name": service})})

    def point(self, t: datetime, service: str, name: str, value: float) -> None:
        self.points.append({
            "time": ns(t), "name": name, "type": "gauge", "value": value,
            "service_name": service,
            "resource_attributes": json.dumps({"service.name": service})})

    def request(self, start: float, k: Knobs) -> None:
        """One request: gateway -> api -> model, with client spans and the api's logs."""
        jitter = self.rng.uniform
        trace = f"{self.rng.getrandbits(128):032x}"
        net = k.network_ms * jitter(0.8, 1.2)
        replica = self.rng.choice(sorted(k.replica_ms)) if k.replica_ms else "model-0"
        version = self.rng.choice(sorted(k.version_ms)) if k.version_ms else None
        model = k.replica_ms.get(replica, k.version_ms.get(version or "", k.model_ms))
        model *= jitter(0.9, 1.1)
        api_own = k.api_ms * jitter(0.9, 1.1)
        api = api_own + (0 if k.api_fails else model + 2 * net)
        gateway = k.gateway_ms * jitter(0.9, 1.1) + api + 2 * net
        t = start
        root = self.span(trace, None, "gateway", "GET /predict", t, gateway)
        call_api = self.span(trace, root, "gateway", "POST api/predict", t + 0.5e6,
                             api + 2 * net)
        served = self.span(trace, call_api, "api", "POST /predict", t + 0.5e6 + net * 1e6, api,
                           error=k.api_fails, http_5xx=k.http_5xx)
        self.log(trace, served, "api", t + 0.6e6 + net * 1e6,
                 f"predict request {self.rng.randint(1, 10_000)} accepted")
        if k.api_fails:
            self.log(trace, served, "api", t + 0.7e6 + net * 1e6,
                     "feature store lookup failed: connection reset by peer", severity=17)
            return
        at = t + (0.5 + net + api_own / 2) * 1e6
        if k.model_down:
            self.span(trace, served, "api", "POST model/infer", at, 2 * net, error=True,
                      http_5xx=k.http_5xx)
            return
        call_model = self.span(trace, served, "api", "POST model/infer", at, model + 2 * net)
        self.span(trace, call_model, "model", "infer", at + net * 1e6, model, replica=replica,
                  version=version)
        self.log(trace, served, "api", at + (model + 2 * net) * 1e6,
                 f"predict request done in {int(model)} ms")

    def metrics(self, t: datetime, cpu: dict[str, float]) -> None:
        for service in SERVICES:
            level = cpu.get(service, 20.0)
            self.point(t, service, "process_cpu_utilization", level * self.rng.uniform(0.95, 1.05))
            self.point(t, service, "process_memory_rss_bytes",
                       2e8 * self.rng.uniform(0.99, 1.01))

    def write(self, store: Store) -> None:
        for table, rows, times in (("spans", self.spans, ("start_time", "end_time")),
                                   ("logs", self.logs, ("time",)),
                                   ("metric_points", self.points, ("time",))):
            if rows:
                cols = {c: [r.get(c) for r in rows] for c in rows[0]}
                data = {c: pa.array(v, pa.timestamp("ns")) if c in times else v
                        for c, v in cols.items()}
                store.append(table, pa.table(data))


def simulate(store: Store, during: Knobs | None = None,
             cpu: Callable[[bool], dict[str, float]] | None = None,
             before: Knobs | None = None) -> Telemetry:
    """Two requests a second for 35 minutes and a metric scrape every 15 s; the first 30
    run with ``before``, the last five (the anomaly window) with ``during`` and
    ``cpu(True)``."""
    tel = Telemetry()
    normal, faulty = before or Knobs(), during or Knobs()
    for second in range(35 * 60):
        t = T0 + timedelta(seconds=second)
        in_anomaly = t >= ANOMALY.start
        for i in range(2):
            tel.request(ns(t) + i * 5e8, faulty if in_anomaly else normal)
        if second % 15 == 0:
            tel.metrics(t, cpu(in_anomaly) if cpu else {})
    tel.write(store)
    return tel


def top(store: Store, entity: str = "service.name") -> tuple[str, FaultClass, list[str]]:
    ranked = rank(store, ANOMALY, BASELINE, entity=entity)
    assert ranked, "some entity must be ranked"
    return ranked[0].entity, ranked[0].fault_class, [r.entity for r in ranked]


# -- specifications --------------------------------------------------------------------------

def test_a_callee_whose_latency_rises_is_ranked_above_its_callers(store: Store) -> None:
    simulate(store, during=Knobs(model_ms=200.0))
    first, fault, order = top(store)
    assert first == "model"
    assert fault is FaultClass.LATENCY
    # The callers' spans got longer too, but only by waiting: they are not accused above it.
    assert all(order.index("model") < order.index(s) for s in ("api", "gateway") if s in order)


def test_a_slower_network_hop_is_charged_to_the_callee_all_slow_calls_go_to(
        store: Store) -> None:
    simulate(store, during=Knobs(network_ms=80.0))
    ranked = rank(store, ANOMALY, BASELINE)
    assert ranked[0].fault_class is FaultClass.NETWORK
    assert all(e.signal.startswith("network_ms:") for e in ranked[0].evidence)


def test_a_cpu_metric_jump_gives_fault_class_cpu(store: Store) -> None:
    simulate(store, cpu=lambda anomalous: {"api": 95.0} if anomalous else {})
    first, fault, _ = top(store)
    assert (first, fault) == ("api", FaultClass.CPU)


def test_an_error_template_burst_gives_errors(store: Store) -> None:
    simulate(store, during=Knobs(api_fails=True))
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("api", FaultClass.ERRORS)
    kinds = {e.kind for e in ranked[0].evidence}
    assert EvidenceKind.LOG_TEMPLATE in kinds
    signals = " ".join(e.signal for e in ranked[0].evidence)
    assert "feature store lookup failed" in signals or "errors:" in signals


def test_a_callee_that_stops_answering_is_a_crash(store: Store) -> None:
    simulate(store, during=Knobs(model_down=True))
    first, fault, _ = top(store)
    assert (first, fault) == ("model", FaultClass.CRASH)


def test_a_5xx_without_an_error_status_is_a_failure_as_everywhere_else(store: Store) -> None:
    """"Failed" means one thing (aiops.semconv): the requests answered 503 failed, and
    their spans are error evidence as if their status said so."""
    simulate(store, during=Knobs(api_fails=True, http_5xx=True))
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("api", FaultClass.ERRORS)
    assert any(e.kind is EvidenceKind.TRACE and e.signal.startswith("errors:")
               for e in ranked[0].evidence), ranked[0].evidence


def test_the_entity_attribute_chooses_the_candidates_a_slow_replica(store: Store) -> None:
    simulate(store, before=Knobs(replica_ms={"model-a": 20.0, "model-b": 20.0}),
             during=Knobs(replica_ms={"model-a": 20.0, "model-b": 250.0}))
    first, fault, order = top(store, entity="service.instance.id")
    assert (first, fault) == ("model-b", FaultClass.LATENCY)
    assert "model-a" not in order[:1]


def test_a_span_attribute_can_be_the_candidate_a_slow_model_version(store: Store) -> None:
    simulate(store, before=Knobs(version_ms={"v1": 20.0, "v2": 20.0}),
             during=Knobs(version_ms={"v1": 20.0, "v2": 150.0}))
    first, fault, order = top(store, entity="aiops.model.version")
    # Only the model's spans carry a version: the others take part but are no candidates.
    assert (first, fault) == ("v2", FaultClass.LATENCY)
    assert set(order) <= {"v1", "v2"}


@pytest.mark.parametrize("fault", ["latency", "cpu", "errors"])
def test_evidence_ids_point_at_real_rows(store: Store, fault: str) -> None:
    knobs = {"latency": Knobs(model_ms=200.0), "errors": Knobs(api_fails=True)}.get(fault)
    simulate(store, during=knobs,
             cpu=(lambda a: {"model": 90.0} if a else {}) if fault == "cpu" else None)
    ranked = rank(store, ANOMALY, BASELINE)
    evidence = [e for r in ranked[:3] for e in r.evidence]
    assert evidence
    for e in evidence:
        if e.kind is EvidenceKind.TRACE:
            n = store.query("SELECT count(*) FROM spans WHERE trace_id = ?", [e.id]).rows[0][0]
        elif e.kind is EvidenceKind.METRIC:
            n = store.query("SELECT count(*) FROM metric_points WHERE name = ? AND "
                            "service_name = ?", [e.id, e.entity]).rows[0][0]
        else:
            bodies = [r[0] for r in store.query(
                "SELECT DISTINCT body FROM logs WHERE service_name = ?", [e.entity]).rows]
            n = sum(1 for b in bodies if _template_regex(e.id).fullmatch(b))
        assert n > 0, f"{e.kind} evidence {e.id!r} of {e.entity} matches no row"


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"<[A-Z]+>|<\*>", template)
    return re.compile(".*?".join(re.escape(p) for p in parts))


def test_nothing_wrong_means_nothing_confident(store: Store) -> None:
    simulate(store)
    ranked = rank(store, ANOMALY, BASELINE)
    # Noise may leave weak traces, but none strong: below the evidence of a real fault.
    assert all(r.score < 1.0 for r in ranked)


def test_the_same_input_gives_the_same_ranking(store: Store) -> None:
    simulate(store, during=Knobs(model_ms=120.0, api_fails=False))
    assert rank(store, ANOMALY, BASELINE) == rank(store, ANOMALY, BASELINE)


def test_baselines_must_not_overlap_the_anomaly(store: Store) -> None:
    with pytest.raises(ValueError, match="overlap"):
        rank(store, ANOMALY, Window(T0, ANOMALY.start + timedelta(seconds=1)))
    with pytest.raises(ValueError, match="not an attribute"):
        rank(store, ANOMALY, BASELINE, entity="x'); DROP TABLE spans; --")


def test_a_raw_duckdb_connection_works_like_a_store(store: Store) -> None:
    import duckdb

    from aiops.schema import TABLES

    simulate(store, during=Knobs(model_ms=200.0))
    con = duckdb.connect()
    for t in TABLES:
        con.execute(t.ddl())
    for name in ("spans", "logs", "metric_points"):
        con.register("src", store.query_arrow(f"SELECT * FROM {name}"))
        con.execute(f"INSERT INTO {name} SELECT * FROM src")
        con.unregister("src")
    assert rank(con, ANOMALY, BASELINE, config=RankConfig())[0].entity == "model"


# -- mesh edges: no traces, only per-edge latency as each end of a call reports it -----------

MESH_EDGES = (("gateway", "api"), ("api", "model"), ("api", "cache"))


def mesh(store: Store, delay: dict[tuple[str, str], float] | None = None,
         gone: dict[tuple[str, str], int] | None = None, down: str | None = None,
         name: str = "request_duration_p50") -> None:
    """One point a minute per edge and reporter (Istio's labels) for 35 minutes; in the
    anomaly window ``delay`` adds seconds to the caller's view of an edge, ``gone`` removes
    an edge from that many of the window's minutes, and the workload ``down`` reports
    nothing itself (its callers still see the calls they make to it)."""
    rng = random.Random(11)
    points: list[dict[str, Any]] = []
    for minute in range(35):
        t = T0 + timedelta(minutes=minute, seconds=20)
        anomalous = minute >= 30
        for edge in MESH_EDGES:
            if anomalous and minute - 30 < (gone or {}).get(edge, 0):
                continue
            served = 0.02 * rng.uniform(0.9, 1.1)
            seen = served + 0.001 * rng.uniform(0.8, 1.2)
            if anomalous:
                seen += (delay or {}).get(edge, 0.0)
            for reporter, value in (("source", seen), ("destination", served)):
                if anomalous and down == edge[0 if reporter == "source" else 1]:
                    continue
                points.append({"time": ns(t), "name": name, "unit": "s",
                               "type": "gauge", "value": value, "attributes": json.dumps({
                                   "reporter": reporter, "source_workload": edge[0],
                                   "destination_workload": edge[1]})})
    cols = {c: [p[c] for p in points] for c in points[0]}
    store.append("metric_points", pa.table(
        {c: pa.array(v, pa.timestamp("ns")) if c == "time" else v for c, v in cols.items()}))


def test_mesh_edges_charge_a_delay_seen_only_by_the_caller_to_the_callee(
        store: Store) -> None:
    mesh(store, delay={("api", "model"): 0.05})
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("model", FaultClass.NETWORK)
    assert ranked[0].evidence[0].id == "request_duration_p50{api->model}"
    assert ranked[0].evidence[0].observed == pytest.approx(51, abs=1)  # ms: 1 + 50


def test_a_call_the_caller_stops_making_charges_the_caller_with_errors(store: Store) -> None:
    mesh(store, gone={("api", "cache"): 5})
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("api", FaultClass.ERRORS)
    assert ranked[0].evidence[0].signal == "mesh:calls"


def test_an_edge_missing_from_one_minute_of_five_is_not_evidence(store: Store) -> None:
    mesh(store, gone={("api", "cache"): 1})
    assert rank(store, ANOMALY, BASELINE) == []


def test_a_caller_seen_nowhere_else_is_not_charged_for_a_missing_call(store: Store) -> None:
    # The gateway's only edge goes: no traffic came in, or its proxy stopped reporting;
    # nothing shows its code ran and skipped the call.
    mesh(store, gone={("gateway", "api"): 5})
    assert not any(e.entity == "gateway" for r in rank(store, ANOMALY, BASELINE)
                   for e in r.evidence)


def test_a_caller_that_is_down_did_not_skip_its_calls(store: Store) -> None:
    # api is down: its calls stop and its own end reports nothing, while the gateway still
    # reports calling it. Whatever else points at api, "stopped making a call" does not.
    mesh(store, gone={("api", "model"): 5, ("api", "cache"): 5}, down="api")
    assert not any(e.signal == "mesh:calls" and e.entity == "api"
                   for r in rank(store, ANOMALY, BASELINE) for e in r.evidence)


def test_a_caller_that_is_up_and_called_but_calls_nothing_is_charged(store: Store) -> None:
    # api's own end still reports gateway's calls, yet it makes none of its own: it fails
    # before them.
    mesh(store, gone={("api", "model"): 5, ("api", "cache"): 5})
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("api", FaultClass.ERRORS)


def test_gauges_of_different_names_are_separate_signals(store: Store) -> None:
    mesh(store, delay={("api", "model"): 0.05}, name="request_duration_p50")
    mesh(store, name="request_duration_p99")  # unchanged: must not water the p50 down
    ranked = rank(store, ANOMALY, BASELINE)
    assert (ranked[0].entity, ranked[0].fault_class) == ("model", FaultClass.NETWORK)
    assert {e.id for e in ranked[0].evidence} == {"request_duration_p50{api->model}"}


def test_mesh_edges_name_services_not_replicas(store: Store) -> None:
    mesh(store, delay={("api", "model"): 0.05})
    assert rank(store, ANOMALY, BASELINE, entity="service.instance.id") == []


def test_an_availability_drop_from_100_percent_is_errors(store: Store) -> None:
    """A share bounded at 100% is compared as the share that failed: 100% -> 96% is a large
    move in its failures, though small against the 100 it sits at (found on PetShop)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    times, names, values, services = [], [], [], []
    for i in range(60):
        for svc in ("search", "site"):
            times.append(t0 + timedelta(minutes=i))
            names.append("availability_Average")
            values.append(96.0 if svc == "search" and i >= 50 else 100.0 - (i % 3) * 0.01)
            services.append(svc)
    store.append("metric_points", pa.table({
        "time": pa.array(times, pa.timestamp("ns")), "name": names, "type": ["gauge"] * 120,
        "value": values, "service_name": services,
        "resource_attributes": [json.dumps({"service.name": s}) for s in services]}))
    ranked = rank(store, Window(t0 + timedelta(minutes=50), t0 + timedelta(minutes=60)),
                  Window(t0, t0 + timedelta(minutes=50)))
    assert [(r.entity, r.fault_class) for r in ranked] == [("search", FaultClass.ERRORS)]


def test_a_move_every_peer_incident_shows_is_not_this_incidents_cause(store: Store) -> None:
    """Peers: the same system's other incidents. A worker whose latency rises in every one of
    them (load moves it, not the fault) does not outrank the database that moved only now;
    without peers it does (found on PetShop's held-out traffic scenarios)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    incidents = [t0 + timedelta(hours=h) for h in (2, 4, 6, 8, 10)]  # the last is this one
    times, values, services = [], [], []

    def point(t: datetime, svc: str, v: float) -> None:
        times.append(t)
        values.append(v)
        services.append(svc)

    for i in range(60):  # the healthy hour
        point(t0 + timedelta(minutes=i), "worker", 10.0 + i % 3)
        point(t0 + timedelta(minutes=i), "db", 5.0 + i % 2)
    for start in incidents:
        for i in range(10):
            point(start + timedelta(minutes=i), "worker", 60.0 + i % 3)  # every incident
            point(start + timedelta(minutes=i), "db", 20.0 if start == incidents[-1] else 5.0)
    n = len(times)
    store.append("metric_points", pa.table({
        "time": pa.array(times, pa.timestamp("ns")), "name": ["latency_Average"] * n,
        "type": ["gauge"] * n, "value": values, "service_name": services,
        "resource_attributes": [json.dumps({"service.name": s}) for s in services]}))
    windows = [Window(s, s + timedelta(minutes=10)) for s in incidents]
    healthy = Window(t0, t0 + timedelta(minutes=60))
    assert rank(store, windows[-1], healthy)[0].entity == "worker"
    with_peers = rank(store, windows[-1], healthy, peers=windows)  # its own window is left out
    assert [r.entity for r in with_peers] == ["db"]
    # Too few peers to say what an incident typically looks like: no change.
    assert rank(store, windows[-1], healthy, peers=windows[:2])[0].entity == "worker"

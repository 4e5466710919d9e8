"""A declared service map: who calls whom when traces do not say. With one, a caller's
symptoms join the incident of the callee it depends on, and the callee ranks first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker, rank_causes
from aiops.analytics.topology import ServiceMap, load_service_map, mesh_calls, parse_service_map
from aiops.errors import ConfigError
from aiops.store import Store
from collectors.prometheus import Target, families_to_rows, to_table

SHOP = parse_service_map({"calls": {"frontend": ["checkout", "cart"],
                                    "checkout": ["payment"]}}, "test")


def _finding(service: str, score: float) -> Finding:
    return Finding("trace_latency", Entity(service, "1"), FaultClass.LATENCY, score, 0, 1,
                   f"{service} is slow", [], change=f"{service}@1 released")


def test_callees_are_reached_through_calls() -> None:
    assert SHOP.callees("frontend") == {"checkout", "cart", "payment"}
    assert SHOP.callees("checkout") == {"payment"}
    assert SHOP.callees("payment") == set()
    loop = ServiceMap(frozenset({("a", "b"), ("b", "a")}))
    assert loop.callees("a") == {"b"}


def test_a_file_is_read_and_a_malformed_one_names_the_problem(tmp_path: Path) -> None:
    good = tmp_path / "map.yaml"
    good.write_text("calls:\n  a: [b]\n")
    assert load_service_map(good).edges == {("a", "b")}
    assert load_service_map(None).edges == frozenset()
    for text, problem in (("calls: [a, b]", "expected a mapping"),
                          ("calls: {a: b}", "must be a list"),
                          ("calls: {a: ['x y']}", "not a service name"),
                          ("calls: {a: [b", "not YAML")):
        good.write_text(text)
        with pytest.raises(ConfigError, match=problem):
            load_service_map(good)
    with pytest.raises(ConfigError, match="cannot read"):
        load_service_map(tmp_path / "missing.yaml")


def test_with_the_map_the_callee_outranks_its_slower_looking_caller() -> None:
    findings = [_finding("frontend", 3.0), _finding("payment", 2.0)]
    assert rank_causes(findings)[0].entity.service == "frontend"
    assert rank_causes(findings, SHOP)[0].entity.service == "payment"


def test_with_the_map_a_callers_symptoms_join_the_callees_incident() -> None:
    alone = IncidentTracker()
    alone.update([_finding("frontend", 3.0), _finding("payment", 2.0)], 0)
    assert set(alone.open) == {"frontend", "payment"}

    mapped = IncidentTracker(calls=SHOP)
    mapped.update([_finding("frontend", 3.0), _finding("payment", 2.0)], 0)
    assert set(mapped.open) == {"payment"}
    assert mapped.open["payment"].causes[0].entity.service == "payment"
    # Services the map does not relate stay apart.
    mapped.update([_finding("cart", 2.0)], 1)
    assert set(mapped.open) == {"payment", "cart"}


# What an Istio sidecar exposes: one series per (reporter, source, destination, code).
_EDGES = [
    {"reporter": "source", "source_workload": "frontend", "source_canonical_service": "frontend",
     "destination_workload": "checkout-v2", "destination_canonical_service": "checkout"},
    {"reporter": "destination", "source_workload": "checkout-v2",
     "destination_workload": "payment"},
    {"reporter": "destination", "source_workload": "unknown", "destination_workload": "frontend"},
]
ISTIO = "# TYPE istio_requests_total counter\n" + "".join(
    "istio_requests_total{" + ",".join(f'{k}="{v}"' for k, v in {**e, "response_code": "200"}
                                       .items()) + "} 40\n" for e in _EDGES) + "up 1\n"


def _scrape_mesh(store: Store, now_ns: int) -> None:
    rows = families_to_rows(ISTIO, Target("mesh", "http://127.0.0.1:15090/stats"), now_ns)
    store.append("metric_points", to_table(rows))


def test_mesh_metrics_give_calls_between_canonical_services(store: Store) -> None:
    now = time.time_ns()
    _scrape_mesh(store, now)
    # Canonical service where the mesh reports one, else the workload; a peer outside the
    # mesh ("unknown") is no service.
    assert mesh_calls(store, now - 10**9).edges == {("frontend", "checkout"),
                                                     ("checkout-v2", "payment")}
    assert mesh_calls(store, now + 10**9).edges == frozenset()  # nothing that recent


def test_the_analyzer_adds_mesh_calls_to_the_known_ones(store: Store) -> None:
    now = time.time_ns()
    _scrape_mesh(store, now)
    analyzer = Analyzer(store, AnalyzerConfig(objectives=()), clock=lambda: now)
    analyzer.set_calls(SHOP)
    assert analyzer.tracker.calls == SHOP  # before a round reads the mesh
    analyzer.step(now)
    assert analyzer.tracker.calls is not None
    assert analyzer.tracker.calls.edges == SHOP.edges | {("frontend", "checkout"),
                                                         ("checkout-v2", "payment")}

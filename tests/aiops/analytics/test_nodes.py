"""A lost Ray node: a finding per replica it held, from the loss until they run elsewhere;
the deepest cause of the incident it opens, with the node named."""

from __future__ import annotations

import json
from typing import Any

from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker
from aiops.analytics.nodes import node_findings
from aiops.schema import NODE_ATTR, NODE_LOST_EVENT, NODE_REPLACED_EVENT
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_logs, log

HELD = [{"model": "echo", "version": "v1", "replica": "r2", "deployment": "echo-v1"},
        {"model": "minilm", "version": "v1", "replica": "m1", "deployment": "minilm-v1"}]


def event(t: int, name: str, node: str = "worker-1",
          replicas: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    row = log(t, f"{name} {node}", severity=17, service="serve-driver")
    row["event_name"] = name
    row["attributes"] = json.dumps({NODE_ATTR: node, "ray.node.id": "ab" * 14,
                                    "aiops.node.replicas": json.dumps(replicas or HELD)})
    return row


def test_a_lost_node_is_a_finding_on_each_replica_it_held(store: Store) -> None:
    add_logs(store, [event(T0 - 20 * NS, NODE_LOST_EVENT)])
    found = node_findings(store, T0)
    assert {(f.entity, f.fault_class, f.node) for f in found} == {
        (Entity("echo", "v1", "r2"), FaultClass.NODE, "worker-1"),
        (Entity("minilm", "v1", "m1"), FaultClass.NODE, "worker-1")}
    assert all(f.score >= 1 and f.start_ns == T0 - 20 * NS for f in found)
    assert found[0].evidence[0].kind is EvidenceKind.EVENT
    assert "worker-1" in found[0].summary and "20 s ago" in found[0].summary


def test_the_finding_ends_once_its_replicas_are_replaced(store: Store) -> None:
    add_logs(store, [event(T0 - 20 * NS, NODE_LOST_EVENT),
                     event(T0 - 5 * NS, NODE_REPLACED_EVENT)])
    assert node_findings(store, T0) == []


def test_a_node_lost_again_after_its_replacement_fires_again(store: Store) -> None:
    add_logs(store, [event(T0 - 60 * NS, NODE_LOST_EVENT),
                     event(T0 - 40 * NS, NODE_REPLACED_EVENT),
                     event(T0 - 10 * NS, NODE_LOST_EVENT, replicas=HELD[:1])])
    assert [f.entity.service for f in node_findings(store, T0)] == ["echo"]


def test_a_node_never_replaced_stops_being_reported_after_the_horizon(store: Store) -> None:
    add_logs(store, [event(T0 - 1000 * NS, NODE_LOST_EVENT)])
    assert node_findings(store, T0, horizon_s=900) == []


def test_an_event_with_an_unreadable_replica_list_finds_nothing_and_fails_nothing(
        store: Store) -> None:
    bad = event(T0 - 5 * NS, NODE_LOST_EVENT)
    bad["attributes"] = json.dumps({NODE_ATTR: "worker-1", "aiops.node.replicas": "{oops"})
    add_logs(store, [bad])
    assert node_findings(store, T0) == []


def test_the_lost_node_leads_the_incident_over_the_crash_and_errors_it_caused() -> None:
    e = Entity("echo", "v1", "r2")
    node = Finding("node_lost", e, FaultClass.NODE, 10.0, T0 - 20 * NS, T0,
                   "Ray node worker-1 was lost", node="worker-1")
    crash = Finding("ebpf_crash", e, FaultClass.CRASH, 1.0, T0 - 19 * NS, T0, "exited")
    errors = Finding("trace_errors", Entity("echo", "v1"), FaultClass.ERRORS, 30.0,
                     T0 - 19 * NS, T0, "errors")
    [inc] = IncidentTracker().update([errors, crash, node], T0)
    top = inc.causes[0]
    assert (top.fault_class, top.node, top.entity) == (FaultClass.NODE, "worker-1", e)
    assert top.to_json()["node"] == "worker-1"
    assert inc.summary.startswith("node worker-1 under echo@v1/r2")
    assert inc.row()["fault_class"] == "node"

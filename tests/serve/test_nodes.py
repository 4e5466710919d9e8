"""The driver's node watch: a node that stops being alive is one loss event naming the
replicas it ran; once each affected deployment is healthy at its replica count elsewhere,
one replacement event. Real OpenTelemetry SDK providers, read back from memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider

from aiops.schema import NODE_ATTR, NODE_LOST_EVENT, NODE_REPLACED_EVENT
from serve.cluster import RayCluster
from serve.nodes import NodeWatcher

HEAD, WORKER = "a" * 56, "b" * 56


class _Telemetry:
    """The two providers NodeWatcher uses, from the OpenTelemetry SDK."""

    def __init__(self) -> None:
        self.exported = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.exported))
        self.meter = MeterProvider().get_meter("test")

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for data in self.exported.get_finished_logs():
            rec = data.log_record
            out.append((rec.event_name, dict(rec.attributes or {})))
        return out


def _row(replica: str, node_id: str, deployment: str = "echo-v1") -> dict[str, Any]:
    return {"pid": 1, "deployment": deployment, "replica": replica, "model": "echo",
            "version": "v1", "node_id": node_id}


def test_a_lost_node_and_the_replacement_of_its_replicas_are_one_event_each(
        tmp_path: Path) -> None:
    alive = {HEAD, WORKER}
    tel = _Telemetry()
    nodes_file = tmp_path / "ray-nodes.json"
    w = NodeWatcher(RayCluster({HEAD: "head", WORKER: "worker-1"}, {HEAD: 10, WORKER: 20}),
                    tel, nodes_file, alive=lambda: set(alive))  # type: ignore[arg-type]
    both = [_row("r1", HEAD), _row("r2", WORKER)]
    w.poll(both, {"echo-v1": 2}, {"echo-v1": True})
    assert tel.events() == []

    alive.discard(WORKER)
    # Serve's status lags: right after the loss it still counts two healthy replicas.
    w.poll([_row("r1", HEAD)], {"echo-v1": 2}, {"echo-v1": True})
    [(name, attrs)] = tel.events()
    assert name == NODE_LOST_EVENT and attrs[NODE_ATTR] == "worker-1"
    assert [r["replica"] for r in json.loads(attrs["aiops.node.replicas"])] == ["r2"]
    assert {n["name"]: n["alive"] for n in json.loads(nodes_file.read_text())} == {
        "head": True, "worker-1": False}

    # Back to one replica of two, or two but not yet healthy: not replaced.
    w.poll([_row("r1", HEAD)], {"echo-v1": 1}, {"echo-v1": True})
    w.poll([_row("r1", HEAD), _row("r3", HEAD)], {"echo-v1": 2}, {"echo-v1": False})
    assert len(tel.events()) == 1
    w.poll([_row("r1", HEAD), _row("r3", HEAD)], {"echo-v1": 2}, {"echo-v1": True})
    names = [n for n, _ in tel.events()]
    assert names == [NODE_LOST_EVENT, NODE_REPLACED_EVENT]
    assert tel.events()[1][1]["aiops.node.replaced_after_s"] >= 0
    w.poll([_row("r1", HEAD), _row("r3", HEAD)], {"echo-v1": 2}, {"echo-v1": True})
    assert len(tel.events()) == 2  # once


def test_a_node_that_held_no_replica_is_still_reported_and_replaced_at_once() -> None:
    alive = {HEAD, WORKER}
    tel = _Telemetry()
    w = NodeWatcher(RayCluster({HEAD: "head", WORKER: "worker-1"}, {}), tel, None,
                    alive=lambda: set(alive))  # type: ignore[arg-type]
    w.poll([_row("r1", HEAD)], {"echo-v1": 1}, {"echo-v1": True})
    alive.clear()
    alive.add(HEAD)
    w.poll([_row("r1", HEAD)], {"echo-v1": 1}, {"echo-v1": True})
    assert [n for n, _ in tel.events()] == [NODE_LOST_EVENT, NODE_REPLACED_EVENT]


def test_an_unreadable_node_table_changes_nothing() -> None:
    tel = _Telemetry()
    w = NodeWatcher(RayCluster({HEAD: "head"}, {}), tel, None,
                    alive=lambda: None)  # type: ignore[arg-type]
    w.poll([], {}, {})
    assert tel.events() == [] and w.alive == {HEAD}

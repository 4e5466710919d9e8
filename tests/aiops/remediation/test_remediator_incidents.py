"""Remediation and the incidents' owner: the remediator hears of each analytics round from the
tracker, asks it to mark an incident mitigating once an action ran (from the round, or from an
approver's request thread), and verifies against what it still has open. Only the tracker
writes the ``incidents`` table."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker
from aiops.control_status import ControlStatus
from aiops.remediation.actions import ControlPlane
from aiops.remediation.policy import Policy
from aiops.remediation.remediator import Remediator
from aiops.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS
ROOT = Path(__file__).resolve().parents[3]
OWNER = "aiops.analytics.incidents"


class FakeControl:
    """echo runs v1 alone (one replica): a latency incident on it is planned as a scale."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def status(self) -> ControlStatus:
        return ControlStatus.model_validate({"models": {"echo": {"stable": "v1", "versions": [
            {"version": "v1", "weight": 100,
             "autoscaling": {"min_replicas": 1, "max_replicas": 1}}]}}})

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        self.calls.append(("scale", model, version, min_replicas, max_replicas))
        return {"ok": True}


def _remediator(store: Store, mode: str, control: FakeControl) -> Remediator:
    @contextmanager
    def connect() -> Iterator[ControlPlane]:
        yield control  # type: ignore[misc]

    policy = Policy.model_validate({"verify_s": 120, "approval_ttl_s": 600, "rules": [
        {"id": "scale", "action": "scale", "target": "*", "mode": mode, "max_replicas": 4}]})
    return Remediator(store, policy, connect)


def _caller() -> str:
    """The module that asked the store to write (past the store's own frames)."""
    frame = sys._getframe(2)
    while frame.f_globals["__name__"] in ("aiops.store", __name__) and frame.f_back:
        frame = frame.f_back
    return str(frame.f_globals["__name__"])


@pytest.fixture
def writers(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(module, table) of every write to ``store``: who writes what."""
    seen: list[tuple[str, str]] = []
    append_many = store.append_many  # append is one of these too

    def spy(batches: dict[str, pa.Table | pa.RecordBatch], **kw: Any) -> Any:
        seen.extend((_caller(), name) for name in [*batches, *kw.get("chained", {})])
        return append_many(batches, **kw)

    monkeypatch.setattr(store, "append_many", spy)
    return seen


def _slow(now_ns: int) -> Finding:
    return Finding("trace_latency", Entity("echo", "v1"), FaultClass.LATENCY, 3.0,
                   now_ns - 10 * NS, now_ns, "p95 8x its baseline",
                   change="echo@v1 first served 40 s ago, after v0")


def _statuses(store: Store) -> list[str]:
    return [r[0] for r in store.query("SELECT status FROM incidents ORDER BY updated_at").rows]


def test_an_executed_action_marks_its_incident_mitigating_through_the_tracker(
        store: Store, writers: list[tuple[str, str]]) -> None:
    control = FakeControl()
    remediator = _remediator(store, "auto", control)
    tracker = IncidentTracker(resolve_after_s=30, store=store)
    remediator.attach(tracker)
    (inc,) = tracker.update([_slow(T0)], T0)  # the round: planned, executed, mitigating
    assert control.calls == [("scale", "echo", "v1", 2, 2)]
    assert _statuses(store) == ["open", "mitigating"]
    assert tracker.open["echo"].status == "mitigating"
    tracker.update([], T0 + 30 * NS)  # the SLI recovered: resolved, the action verified
    assert _statuses(store) == ["open", "mitigating", "resolved"]
    assert store.query("SELECT status FROM actions_current").rows == [("verified",)]
    assert {m for m, table in writers if table == "incidents"} == {OWNER}
    assert ("aiops.remediation.remediator", "actions") in writers
    assert inc.incident_id in {r[0] for r in store.query(
        "SELECT incident_id FROM actions").rows}


def test_an_approval_from_a_request_thread_goes_through_the_tracker(
        store: Store, writers: list[tuple[str, str]]) -> None:
    control = FakeControl()
    remediator = _remediator(store, "approve", control)
    tracker = IncidentTracker(resolve_after_s=30, store=store)
    remediator.attach(tracker)
    tracker.update([_slow(T0)], T0)
    (pending,) = remediator.pending()
    assert _statuses(store) == ["open"] and not control.calls
    decided: list[dict[str, Any]] = []
    approver = threading.Thread(target=lambda: decided.append(remediator.decide_pending(
        pending["action_id"], True, "user:bob", T0 + NS)))
    approver.start()
    for k in range(2, 6):  # rounds go on meanwhile
        tracker.update([_slow(T0 + k * NS)], T0 + k * NS)
    approver.join(timeout=30)
    assert decided and decided[0]["status"] == "executed"
    assert _statuses(store)[-1] == "mitigating" and "mitigating" in _statuses(store)
    assert store.query("SELECT status FROM incidents_current").rows == [("mitigating",)]
    assert {m for m, table in writers if table == "incidents"} == {OWNER}


def test_without_an_owner_attached_an_action_marks_nothing(store: Store) -> None:
    control = FakeControl()
    remediator = _remediator(store, "auto", control)
    tracker = IncidentTracker(store=store)
    (inc,) = tracker.update([_slow(T0)], T0)
    remediator.on_round([inc], T0)  # heard, but not attached: nothing to mark
    assert control.calls and _statuses(store) == ["open"]


def test_only_the_tracker_appends_to_incidents() -> None:
    """In the package's source, the tracker's module is the one that names the table in a
    write; a second writer would race it (and the table's latest row would lie)."""
    write = re.compile(r"append(_many)?\(\s*[\"']incidents[\"']|[\"']incidents[\"']\s*:\s*"
                       r"(to_table|pa\.)")
    writers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "aiops").rglob("*.py")
                     if write.search(p.read_text(encoding="utf-8")))
    assert writers == ["aiops/analytics/incidents.py"]



def _lost(now_ns: int) -> Finding:
    return Finding("node_lost", Entity("echo", "v1", "echo#r1"), FaultClass.NODE, 3.0,
                   now_ns - 5 * NS, now_ns, "Ray node worker-1 was lost", node="worker-1")


def test_an_incident_a_lost_node_caused_gets_no_action_while_its_replicas_move(
        store: Store) -> None:
    control = FakeControl()
    remediator = _remediator(store, "auto", control)
    tracker = IncidentTracker(resolve_after_s=30, store=store)
    remediator.attach(tracker)
    (inc,) = tracker.update([_lost(T0)], T0)
    for k in range(1, 4):  # the latency while Serve moves the replicas
        tracker.update([_slow(T0 + k * NS)], T0 + k * NS)
        assert tracker.open_ids() == {inc.incident_id}
    assert control.calls == [] and remediator.pending() == []
    assert store.query("SELECT count(*) FROM actions").rows == [(0,)]


def test_what_was_planned_for_the_symptom_before_the_node_was_declared_lost_is_withdrawn(
        store: Store) -> None:
    """Ray declares a node dead seconds after its replicas' requests begin to suffer: the
    latency comes first and a scale waits for an approver when the node's loss arrives."""
    control = FakeControl()
    remediator = _remediator(store, "approve", control)
    tracker = IncidentTracker(resolve_after_s=30, store=store)
    remediator.attach(tracker)
    tracker.update([_slow(T0)], T0)
    (pending,) = remediator.pending()
    tracker.update([_slow(T0 + NS), _lost(T0 + NS)], T0 + NS)
    assert remediator.pending() == [] and control.calls == []
    assert store.query("SELECT status, (outcome->>'reason') FROM actions_current").rows == [
        ("withdrawn", "a lost node explains the incident; Serve reschedules its replicas")]
    with pytest.raises(ValueError, match="withdrawn, not pending"):
        remediator.decide_pending(pending["action_id"], True, "user:bob", T0 + 2 * NS)
    tracker.update([_slow(T0 + 3 * NS)], T0 + 3 * NS)
    assert store.query("SELECT count(DISTINCT action_id) FROM actions").rows == [(1,)]

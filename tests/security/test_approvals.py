"""A pending action survives a restart: it can still be approved (once), denied, or expire."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from aiops.remediation.actions import ActionKind, ControlPlane, new_action
from aiops.remediation.policy import Policy
from aiops.remediation.remediator import Remediator
from aiops.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS

POLICY = Policy.model_validate({"approval_ttl_s": 600, "rules": [
    {"id": "scale-with-approval", "action": "scale", "target": "*", "mode": "approve",
     "max_replicas": 4}]})


class FakeControl:
    """The control plane: records what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        self.calls.append(("scale", model, version, min_replicas, max_replicas))
        return {"ok": True}


def remediator(store: Store, control: FakeControl) -> Remediator:
    @contextmanager
    def connect() -> Iterator[ControlPlane]:
        yield control  # type: ignore[misc]

    return Remediator(store, POLICY, connect)


def propose_then_restart(path: Path) -> tuple[str, Store, FakeControl]:
    store = Store(path)
    control = FakeControl()
    action = new_action("inc-1", ActionKind.SCALE, "echo", "v2", T0, min_replicas=2,
                        max_replicas=2)
    action.reason, action.evidence = "p95 over the SLO", ["trace:ab"]
    proposed = remediator(store, control).propose(action, "agent:alice", T0)
    assert proposed["status"] == "pending" and not control.calls
    store.close()
    return proposed["action_id"], Store(path), control


def test_a_pending_action_is_approved_after_a_restart(tmp_path: Path) -> None:
    action_id, store, _ = propose_then_restart(tmp_path / "t.duckdb")
    try:
        control = FakeControl()
        r = remediator(store, control)
        [pending] = r.pending()
        assert (pending["action_id"], pending["rule"], pending["reason"]) == (
            action_id, "scale-with-approval", "p95 over the SLO")
        done = r.decide_pending(action_id, True, "user:bob", T0 + 60 * NS)
        assert done["status"] == "executed"
        assert control.calls == [("scale", "echo", "v2", 2, 2)]
        with pytest.raises(ValueError, match="not pending"):
            r.decide_pending(action_id, False, "user:eve", T0 + 61 * NS)
        (status,) = store.query("SELECT status FROM actions_current WHERE action_id = ?",
                                [action_id]).rows[0]
        assert status == "executed"
        actors = [a for (a,) in store.query("SELECT actor FROM ledger ORDER BY seq").rows]
        assert actors == ["agent:alice", "policy", "user:bob", "executor"]
    finally:
        store.close()


def test_a_decided_action_is_not_decided_again_after_another_restart(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    action_id, store, control = propose_then_restart(path)
    remediator(store, control).decide_pending(action_id, False, "user:bob", T0 + NS)
    store.close()
    store = Store(path)
    try:
        r = remediator(store, control)
        assert r.pending() == []
        with pytest.raises(ValueError, match="denied, not pending"):
            r.decide_pending(action_id, True, "user:eve", T0 + 2 * NS)
        assert not control.calls
    finally:
        store.close()


def test_a_reloaded_pending_action_still_expires(tmp_path: Path) -> None:
    action_id, store, control = propose_then_restart(tmp_path / "t.duckdb")
    try:
        r = remediator(store, control)
        with pytest.raises(ValueError, match="expired"):
            r.decide_pending(action_id, True, "user:bob", T0 + 601 * NS)
        assert not control.calls
        (status,) = store.query("SELECT status FROM actions_current WHERE action_id = ?",
                                [action_id]).rows[0]
        assert status == "expired"
    finally:
        store.close()

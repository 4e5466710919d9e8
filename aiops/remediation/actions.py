"""Actions and how each is carried out through the Serve control plane (P3's API)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from aiops.control_status import ControlStatus
from aiops.errors import AIOpsError

__all__ = ["Action", "ActionKind", "ActionStatus", "ControlPlane", "IllegalTransition",
           "NotSupported", "Target", "execute", "new_action"]


class ActionKind(StrEnum):
    ROLLBACK = "rollback"
    SHIFT_TRAFFIC = "shift_traffic"
    PROMOTE = "promote"
    SCALE = "scale"
    RESTART_REPLICA = "restart_replica"
    SHED_LOAD = "shed_load"


class ActionStatus(StrEnum):
    """An action's states, as the ``actions`` table and the ledger record them."""

    NEW = "new"  # not recorded yet (never written)
    PROPOSED = "proposed"
    DENIED = "denied"
    DRY_RUN = "dry_run"
    PENDING = "pending"  # waiting for an approver
    APPROVED = "approved"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    EXECUTED = "executed"
    VERIFIED = "verified"
    FAILED = "failed"

    def can_become(self, other: ActionStatus) -> bool:
        return other in _NEXT[self]


_S = ActionStatus
# Every move an action may make; anything else is a bug, refused before it is recorded.
_NEXT: dict[ActionStatus, frozenset[ActionStatus]] = {
    _S.NEW: frozenset({_S.PROPOSED}),
    _S.PROPOSED: frozenset({_S.DENIED, _S.DRY_RUN, _S.PENDING, _S.APPROVED}),
    _S.PENDING: frozenset({_S.APPROVED, _S.DENIED, _S.EXPIRED, _S.WITHDRAWN}),
    _S.APPROVED: frozenset({_S.EXECUTED, _S.FAILED}),
    _S.EXECUTED: frozenset({_S.VERIFIED, _S.FAILED}),
    **{s: frozenset() for s in (_S.DENIED, _S.DRY_RUN, _S.EXPIRED, _S.WITHDRAWN, _S.VERIFIED,
                                _S.FAILED)},
}


class IllegalTransition(AIOpsError):
    """An action asked to move between states it may not (a bug: nothing is recorded)."""


class NotSupported(AIOpsError):
    """An action the control plane cannot carry out yet."""


class ControlPlane(Protocol):
    """What remediation needs of the control plane; ``aiops.lifecycle.LifecycleClient``."""

    def status(self) -> ControlStatus: ...
    def rollback(self, model: str) -> dict[str, Any]: ...
    def set_traffic(self, model: str, weights: dict[str, int]) -> dict[str, Any]: ...
    def canary(self, model: str, version: str, percent: int) -> dict[str, Any]: ...
    def shed(self, model: str, classes: list[str]) -> dict[str, Any]: ...
    def restart_replica(self, model: str, version: str, replica: str | None = None
                        ) -> dict[str, Any]: ...
    def promote(self, model: str, version: str) -> dict[str, Any]: ...
    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Target:
    """What an action acts on: a model and, where it names one, a version. The actions table
    and the ledger write it as ``model@version`` (the model alone without a version); ``parse``
    reads that back, so no caller splits the text itself."""

    model: str
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.model}@{self.version}" if self.version else self.model

    @classmethod
    def parse(cls, text: str) -> Target:
        # The last "@": a version never holds one, a model name might.
        model, sep, version = text.rpartition("@")
        return cls(model, version or None) if sep and model else cls(text)


@dataclass
class Action:
    action_id: str
    incident_id: str | None
    kind: ActionKind
    model: str
    version: str | None
    created_ns: int
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    evidence: list[str] = field(default_factory=list)  # evidence ids behind it

    @property
    def target(self) -> str:
        """The model, as policies match it."""
        return self.model

    @property
    def subject(self) -> Target:
        """The model and version it acts on."""
        return Target(self.model, self.version)

    def describe(self) -> str:
        lo, hi = self.params.get("min_replicas"), self.params.get("max_replicas")
        target = f"{self.model} {self.version}" if self.version else self.model
        what = {ActionKind.ROLLBACK: f"roll {self.model} back from {self.version}",
                ActionKind.SCALE: f"scale {target} to "
                                  + (f"{lo} replicas" if lo == hi else f"{lo}-{hi} replicas"),
                ActionKind.SHIFT_TRAFFIC: f"shift {self.model} traffic to "
                                          f"{self.params.get('weights')}",
                ActionKind.PROMOTE: f"promote {self.model} {self.version}",
                ActionKind.RESTART_REPLICA: f"restart {self.model} {self.version} replica "
                                            f"{self.params.get('replica') or '(any)'}",
                ActionKind.SHED_LOAD: f"shed {'/'.join(self.params.get('classes', []))} "
                                      f"load of {self.model}"}
        return what.get(self.kind, f"{self.kind} {self.model}")


def new_action(incident_id: str | None, kind: ActionKind, model: str, version: str | None,
               now_ns: int, **params: Any) -> Action:
    return Action(f"act-{uuid.uuid4().hex[:12]}", incident_id, kind, model, version, now_ns,
                  params)


def execute(control: ControlPlane, action: Action) -> dict[str, Any]:
    """Carry the action out; the control plane's answer is the outcome."""
    p = action.params
    if action.kind is ActionKind.ROLLBACK:
        return control.rollback(action.model)
    if action.kind is ActionKind.SHIFT_TRAFFIC:
        return control.set_traffic(action.model, dict(p["weights"]))
    if action.kind is ActionKind.PROMOTE and action.version:
        return control.promote(action.model, action.version)
    if action.kind is ActionKind.SCALE and action.version:
        return control.scale(action.model, action.version, int(p["min_replicas"]),
                             int(p["max_replicas"]))
    if action.kind is ActionKind.RESTART_REPLICA and action.version:
        return control.restart_replica(action.model, action.version, p.get("replica"))
    if action.kind is ActionKind.SHED_LOAD:
        return control.shed(action.model, list(p.get("classes", ["batch"])))
    raise NotSupported(f"{action.kind} is not supported by the control plane yet")

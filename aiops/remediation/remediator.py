"""The act step of the loop: incident -> planned action -> policy -> execute -> verify.

Every step is a row of ``actions`` (its state) and an entry of the hash-chained ``ledger``
(actor, decision, incident and evidence ids), appended in one transaction. One action per
incident: a repeat would fight the first. After execution the incident is ``mitigating``; the
action is ``verified`` when the incident resolves (its SLIs recovered) within the policy's
``verify_s``, else ``failed`` and escalated (a ledger entry and an error log; a rollback is not
undone, since that would send traffic back to the version that broke).

Incidents belong to their tracker (``aiops.analytics.incidents``): the remediator ``attach``es to
it, hears of each analytics round as one of its listeners, asks it to mark an incident
``mitigating`` (the tracker writes that row) and reads which incidents are still open.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from aiops.analytics.findings import FaultClass
from aiops.analytics.incidents import Incident, IncidentTracker, Status
from aiops.control_status import ControlStatus, ReplicaBounds
from aiops.errors import AIOpsError
from aiops.remediation.actions import (
    Action,
    ActionKind,
    ActionStatus,
    ControlPlane,
    IllegalTransition,
    Target,
    execute,
    new_action,
)
from aiops.remediation.policy import Mode, Past, Policy
from aiops.schema import ACTIONS
from aiops.store import Store

__all__ = ["Remediator", "plan"]

log = logging.getLogger(__name__)

SCALABLE = ("latency", "cpu")
RESTARTABLE = ("memory",)
SCALE_CEILING = 4  # replicas the planner scales to before it sheds batch load instead
# An incident whose top cause is a service that calls others (the service map says so) is a
# symptom until shown otherwise: its users see a callee's fault first, and the callee's own
# findings follow a round or two later (its spans arrive later). Its plan waits this long
# after the incident opened for a callee to fire (the incident then names it); if none does,
# the caller itself is acted on. The tracker already held the caller's findings for its
# caller grace (5 s) before it opened the incident: the two together are the 10 s this wait
# alone was.
CALLER_SETTLE_S = 5.0


def plan(incident: Incident, status: ControlStatus, now_ns: int) -> Action | None:
    """What to do about an incident, given the models' versions and weights (or None)."""
    if not incident.causes:
        return None
    cause = incident.causes[0]
    if any(c.fault_class is FaultClass.NODE for c in incident.causes):
        # Serve reschedules a lost node's replicas on the nodes left; the incident resolves
        # once they are replaced. A rollback or restart would not bring the node back, and the
        # latency or errors while they move (which can outrank the node in a later round) are
        # its consequence, not a load to scale for.
        return None
    model = status.models.get(cause.entity.service)
    if model is None or cause.entity.version is None:
        return None
    mine = model.version(cause.entity.version)
    if mine is None:
        return None
    others = [v for v in model.versions if v.version != cause.entity.version]
    evidence = [e.id for e in cause.evidence][:8]
    reason = f"{incident.incident_id}: {cause.fault_class} on {cause.entity}"
    stable = model.stable
    # A known-good version other than the faulty one: return to it, whether the faulty one is
    # a canary (weight < 100) or replaced it entirely (an attached Serve app's new config).
    if others and stable is not None and stable != cause.entity.version and \
            model.version(stable) is not None:
        action = new_action(incident.incident_id, ActionKind.ROLLBACK, cause.entity.service,
                            cause.entity.version, now_ns, to=stable)
    elif str(cause.fault_class) in RESTARTABLE and cause.entity.replica:
        # One replica leaking or wedged, the others fine: a fresh process is the remedy.
        action = new_action(incident.incident_id, ActionKind.RESTART_REPLICA,
                            cause.entity.service, cause.entity.version, now_ns,
                            replica=cause.entity.replica)
    elif str(cause.fault_class) in SCALABLE:
        bounds = mine.autoscaling or ReplicaBounds(min_replicas=1, max_replicas=1)
        if bounds.min_replicas >= SCALE_CEILING:
            # Scaled out as far as the plan goes: keep interactive traffic within its SLO by
            # refusing the batch class until the incident resolves.
            action = new_action(incident.incident_id, ActionKind.SHED_LOAD,
                                cause.entity.service, cause.entity.version, now_ns,
                                classes=["batch"])
        else:
            action = new_action(incident.incident_id, ActionKind.SCALE, cause.entity.service,
                                cause.entity.version, now_ns,
                                min_replicas=bounds.min_replicas + 1,
                                max_replicas=max(bounds.max_replicas,
                                                 bounds.min_replicas + 1))
    else:
        return None
    action.reason, action.evidence = reason, evidence
    return action


def _verdict(inc: Incident) -> tuple[str, str, str]:
    top = inc.causes[0]
    return (inc.incident_id, str(Target(top.entity.service, top.entity.version)),
            str(top.fault_class))


@dataclass
class _Tracked:
    action: Action
    status: ActionStatus
    mode: Mode
    rule: str
    executed_ns: int | None = None
    decision: str = ""  # why the policy decided as it did
    written_ns: int = 0  # rows of one action get strictly increasing updated_at


class Remediator:
    def __init__(self, store: Store, policy: Policy,
                 control: Callable[[], AbstractContextManager[ControlPlane]],
                 recall: Callable[[str], str | None] | None = None) -> None:
        self.store = store
        self.policy = policy
        self.control = control
        # A past incident like this one ("seen before: inc-..., fixed by rollback,
        # verified"), for the plan's reason; the server passes the incident memory's.
        self.recall = recall
        self.actions: dict[str, _Tracked] = {}
        # (incident, cause, fault class) already acted on: one action per verdict, so a
        # repeat does not fight the first, but an incident whose cause changes is replanned.
        self._planned: set[tuple[str, str, str]] = set()
        # Incidents a lost node was ever a cause of: once the node's event ages out of the
        # window, the latency while Serve moves its replicas can be a round's only cause, and
        # is still the node's consequence (nothing to scale or roll back for).
        self._node_lost: set[str] = set()
        # Incidents whose plan waits for their callees (CALLER_SETTLE_S), re-read each round.
        self._settling: set[str] = set()
        self.caller_settle_ns = int(CALLER_SETTLE_S * 1e9)
        self._lock = threading.Lock()
        # The incidents' owner, once attached: without one, actions mark nothing mitigating.
        self.incidents: IncidentTracker | None = None
        self._reload_pending()

    def attach(self, incidents: IncidentTracker,
               listener: Callable[[list[Incident], int], None] | None = None) -> None:
        """Act on the incidents ``incidents`` owns: hear of its rounds, mark what an action
        was taken for ``mitigating`` there, verify against what it still has open.
        ``listener``: what hears the rounds instead of ``on_round`` itself (the server: a
        ``RoundWorker`` running ``on_round`` on its own thread, so that detection never waits
        on a control plane); None: ``on_round`` in the tracker's call."""
        self.incidents = incidents
        incidents.subscribe(listener if listener is not None else self.on_round)

    def _reload_pending(self) -> None:
        """Actions still waiting for an approver when the server last stopped: tracked again,
        so that they can be approved or denied, and expire, as if it had not."""
        rows = self.store.query(
            "SELECT action_id, incident_id, epoch_ns(created_at), kind, target, params, mode, "
            "outcome, epoch_ns(updated_at) FROM actions_current WHERE status = 'pending' "
            "ORDER BY created_at").rows
        for (action_id, incident_id, created_ns, kind, target, params, mode, outcome,
             updated_ns) in rows:
            try:
                decided = json.loads(outcome or "{}")
                subject = Target.parse(str(target or ""))
                action = Action(action_id, incident_id, ActionKind(kind), subject.model,
                                subject.version, int(created_ns), json.loads(params or "{}"))
                action.reason, action.evidence = self._proposal(action_id)
                tracked = _Tracked(action, ActionStatus.PENDING, Mode(mode),
                                   str(decided.get("rule", "")),
                                   decision=str(decided.get("reason", "")),
                                   written_ns=int(updated_ns or 0))
            except (ValueError, TypeError, AttributeError) as exc:
                log.error("cannot reload pending action %s: %s", action_id, exc)
                continue
            self.actions[action_id] = tracked
        if rows:
            log.info("reloaded %d pending action(s)", len(self.actions))

    def _proposal(self, action_id: str) -> tuple[str, list[str]]:
        """The reason and evidence an action was proposed with, from its ledger entry."""
        rows = self.store.query("SELECT entry FROM ledger WHERE action_id = ? "
                                "ORDER BY seq LIMIT 1", [action_id]).rows
        entry = json.loads(rows[0][0]) if rows else {}
        outcome = entry.get("outcome") or {}
        return str(outcome.get("reason", "")), [str(e) for e in entry.get("evidence") or []]

    # -- the loop ----------------------------------------------------------------------------

    def on_round(self, changed: list[Incident], now_ns: int) -> None:
        """After an analytics round (the tracker's listener): plan for new incidents, verify
        and expire the rest."""
        with self._lock:
            for inc in self._with_settling(changed):
                if any(c.fault_class is FaultClass.NODE for c in inc.causes) and \
                        inc.incident_id not in self._node_lost:
                    self._node_lost.add(inc.incident_id)
                    self._withdraw(inc.incident_id, now_ns)
                self._settling.discard(inc.incident_id)
                if inc.status is Status.OPEN and inc.causes and \
                        inc.incident_id not in self._node_lost and \
                        _verdict(inc) not in self._planned:
                    if self._callees_may_fire(inc, now_ns):
                        self._settling.add(inc.incident_id)
                    else:
                        self._handle(inc, now_ns)
            self._verify(now_ns)
            self._expire(now_ns)

    def _with_settling(self, changed: list[Incident]) -> list[Incident]:
        """This round's changed incidents, and those still waiting for their callees."""
        if not self._settling or self.incidents is None:
            return changed
        seen = {i.incident_id for i in changed}
        still = [i for i in self.incidents.open.values()
                 if i.incident_id in self._settling and i.incident_id not in seen]
        self._settling &= seen | {i.incident_id for i in still}  # resolved ones are gone
        return [*changed, *still]

    def _callees_may_fire(self, inc: Incident, now_ns: int) -> bool:
        calls = self.incidents.calls if self.incidents is not None else None
        return calls is not None and bool(calls.callees(inc.causes[0].entity.service)) \
            and now_ns - inc.opened_ns < self.caller_settle_ns

    def _handle(self, inc: Incident, now_ns: int) -> None:
        try:
            with self.control() as control:
                status = control.status()
        except AIOpsError as exc:
            log.warning("cannot read the control plane to plan for %s: %s", inc.incident_id, exc)
            return
        action = plan(inc, status, now_ns)
        if action is None:
            return
        seen = self.recall(inc.incident_id) if self.recall is not None else None
        if seen:
            action.reason = f"{action.reason}; {seen}"
        self._planned.add(_verdict(inc))
        self._submit(action, "planner", now_ns)

    def propose(self, action: Action, actor: str, now_ns: int) -> dict[str, Any]:
        """An action proposed from outside the loop (the agent, chat-ops): the same policy
        decides it, and the same ledger records it, as for the planner's own."""
        with self._lock:
            return self.describe(self._submit(action, actor, now_ns))

    def _submit(self, action: Action, actor: str, now_ns: int) -> _Tracked:
        replicas = action.params.get("max_replicas")
        decision = self.policy.decide(action.kind, action.target, now_ns, self._history(),
                                      replicas if isinstance(replicas, int) else None)
        tracked = _Tracked(action, ActionStatus.NEW, decision.mode, decision.rule,
                           decision=decision.reason)
        self.actions[action.action_id] = tracked
        self._record(tracked, "proposed", actor, now_ns, {"reason": action.reason})
        outcome = {"rule": decision.rule, "reason": decision.reason}
        if decision.mode is Mode.OFF:
            self._record(tracked, "denied", "policy", now_ns, outcome)
        elif decision.mode is Mode.DRY_RUN:
            self._record(tracked, "dry_run", "policy", now_ns, outcome)
        elif decision.mode is Mode.APPROVE:
            self._record(tracked, "pending", "policy", now_ns, outcome)
        else:
            self._record(tracked, "approved", "policy", now_ns, outcome)
            self._execute(tracked, now_ns)
        return tracked

    def _withdraw(self, incident_id: str, now_ns: int) -> None:
        """A lost node turned out to explain the incident (Ray declares a node dead some
        seconds after its replicas' requests began to suffer): what was planned for the
        symptom and still waits for an approver is withdrawn."""
        for t in self.actions.values():
            if t.action.incident_id == incident_id and t.status == "pending":
                self._record(t, "withdrawn", "planner", now_ns, {
                    "reason": "a lost node explains the incident; Serve reschedules its "
                              "replicas"})

    def _execute(self, t: _Tracked, now_ns: int) -> None:
        try:
            with self.control() as control:
                result = execute(control, t.action)
        except AIOpsError as exc:
            self._record(t, "failed", "executor", now_ns, {"error": str(exc)})
            log.error("action %s (%s) failed: %s", t.action.action_id, t.action.describe(), exc)
            return
        t.executed_ns = now_ns
        self._record(t, "executed", "executor", now_ns, {"result": result})
        log.info("executed %s: %s", t.action.action_id, t.action.describe())
        if self.incidents is not None and t.action.incident_id:
            # The tracker writes the incident's new state: the one writer of incidents.
            self.incidents.mark_mitigating(t.action.incident_id, now_ns)

    def _verify(self, now_ns: int) -> None:
        if self.incidents is None:
            return
        open_ids = self.incidents.open_ids()
        for t in self.actions.values():
            if t.status != "executed" or t.executed_ns is None:
                continue
            if t.action.incident_id not in open_ids:
                outcome: dict[str, Any] = {"recovered_after_s": (now_ns - t.executed_ns) / 1e9}
                if t.action.kind is ActionKind.SHED_LOAD:
                    outcome["lifted"] = self._lift(t)
                self._record(t, "verified", "verifier", now_ns, outcome)
            elif now_ns - t.executed_ns >= self.policy.verify_s * 1e9:
                self._record(t, "failed", "verifier", now_ns, {
                    "error": f"the SLI did not recover within {self.policy.verify_s:g} s",
                    "escalated": True})
                log.error("ESCALATION: %s did not fix %s within %g s", t.action.describe(),
                          t.action.incident_id, self.policy.verify_s)

    def _lift(self, t: _Tracked) -> bool:
        """Shedding lasts until its incident resolves: then the classes are served again."""
        try:
            with self.control() as control:
                control.shed(t.action.model, [])
        except AIOpsError as exc:
            log.error("could not lift the load shedding of %s: %s", t.action.model, exc)
            return False
        return True

    def _expire(self, now_ns: int) -> None:
        for t in self.actions.values():
            if t.status == "pending" and self._expired(t, now_ns):
                self._record(t, "expired", "policy", now_ns, self._expiry())

    def _expired(self, t: _Tracked, now_ns: int) -> bool:
        return now_ns - t.action.created_ns >= self.policy.approval_ttl_s * 1e9

    def _expiry(self) -> dict[str, Any]:
        return {"reason": f"not approved within {self.policy.approval_ttl_s:g} s"}

    # -- approvals ---------------------------------------------------------------------------

    def decide_pending(self, action_id: str, approve: bool, who: str, now_ns: int
                       ) -> dict[str, Any]:
        with self._lock:
            t = self.actions.get(action_id)
            if t is None:
                # Decided (or expired) before this process started: say so, never decide again.
                rows = self.store.query("SELECT status FROM actions_current WHERE action_id = ?",
                                        [action_id]).rows
                if rows:
                    raise ValueError(f"action {action_id} is {rows[0][0]}, not pending")
                raise KeyError(action_id)
            if t.status != "pending":
                raise ValueError(f"action {action_id} is {t.status}, not pending")
            if self._expired(t, now_ns):
                self._record(t, "expired", "policy", now_ns, self._expiry())
                raise ValueError(f"action {action_id} is expired, not pending")
            if not approve:
                self._record(t, "denied", who, now_ns, {"reason": "denied by an approver"})
            else:
                self._record(t, "approved", who, now_ns, {})
                self._execute(t, now_ns)
            return self.describe(t)

    def pending(self) -> list[dict[str, Any]]:
        return [self.describe(t) for t in self.actions.values() if t.status == "pending"]

    @staticmethod
    def describe(t: _Tracked) -> dict[str, Any]:
        a = t.action
        return {"action_id": a.action_id, "incident_id": a.incident_id, "kind": str(a.kind),
                "model": a.model, "version": a.version, "params": a.params,
                "status": t.status, "mode": str(t.mode), "rule": t.rule,
                "decision": t.decision,
                "description": a.describe(), "reason": a.reason}

    # -- records -----------------------------------------------------------------------------

    def _history(self) -> list[Past]:
        return [Past(str(t.action.kind), t.action.target, t.executed_ns or t.action.created_ns,
                     t.executed_ns is not None, t.status == "executed")
                for t in self.actions.values()]

    def _record(self, t: _Tracked, status: str, actor: str, now_ns: int,
                outcome: dict[str, Any]) -> None:
        new = ActionStatus(status)
        if not t.status.can_become(new):
            raise IllegalTransition(f"action {t.action.action_id} cannot go from {t.status} "
                                    f"to {new}")
        t.status = new
        now_ns = t.written_ns = max(now_ns, t.written_ns + 1)
        a = t.action
        row = {"action_id": a.action_id, "incident_id": a.incident_id, "created_at": a.created_ns,
               "kind": str(a.kind), "target": str(a.subject),
               "params": json.dumps(a.params), "mode": str(t.mode), "status": status,
               "outcome": json.dumps(outcome, default=str), "updated_at": now_ns}
        entry = {"time": now_ns, "actor": actor, "action_id": a.action_id, "status": status,
                 "incident_id": a.incident_id, "kind": str(a.kind), "target": row["target"],
                 "params": a.params, "rule": t.rule, "mode": str(t.mode),
                 "evidence": a.evidence, "outcome": outcome}
        self.store.append_many({"actions": pa.Table.from_pylist([row],
                                                               schema=ACTIONS.arrow_schema)},
                               chained={"ledger": [json.loads(json.dumps(entry, default=str))]})

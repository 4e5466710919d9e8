"""A caller's symptom is not acted on while its callees may still show the cause: the plan of
an incident topped by a service that calls others waits (CALLER_SETTLE_S) for a callee to
fire, and acts on the caller itself only when none does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker
from aiops.analytics.topology import ServiceMap
from aiops.control_status import ControlStatus
from aiops.remediation.actions import ControlPlane
from aiops.remediation.policy import Policy
from aiops.remediation.remediator import CALLER_SETTLE_S, Remediator
from aiops.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS
SHOP = ServiceMap(frozenset({("shop", "shop.Scorer")}))


class Releases:
    """An attached app's deployments, each at release 2 with release 1 kept as healthy."""

    def __init__(self) -> None:
        self.rolled_back: list[str] = []

    def status(self) -> ControlStatus:
        release = {"stable": "1", "versions": [{"version": "1", "weight": 0},
                                               {"version": "2", "weight": 100}]}
        return ControlStatus.model_validate({"models": {"shop": release,
                                                        "shop.Scorer": release}})

    def rollback(self, model: str) -> dict[str, Any]:
        self.rolled_back.append(model)
        return {"ok": True}


def _tracked(store: Store) -> tuple[IncidentTracker, Releases]:
    control = Releases()

    @contextmanager
    def connect() -> Iterator[ControlPlane]:
        yield control  # type: ignore[misc]

    policy = Policy.model_validate({"verify_s": 120, "approval_ttl_s": 600, "rules": [
        {"id": "rollback", "action": "rollback", "target": "*", "mode": "auto"}]})
    # No caller grace in the tracker: the remediator's own wait is what these specify.
    tracker = IncidentTracker(calls=SHOP, store=store, caller_grace_s=0)
    Remediator(store, policy, connect).attach(tracker)
    return tracker, control


def _errors(service: str, at: int) -> Finding:
    return Finding("trace_errors", Entity(service, "2"), FaultClass.ERRORS, 3.0, at - 10 * NS,
                   at, f"errors on {service}", change=f"{service}@2 first served, after 1")


def test_the_callee_that_fires_after_its_caller_is_the_one_rolled_back(store: Store) -> None:
    tracker, control = _tracked(store)
    tracker.update([_errors("shop", T0)], T0)
    assert control.rolled_back == []  # the ingress's users saw it first: wait for callees
    tracker.update([_errors("shop", T0 + 2 * NS), _errors("shop.Scorer", T0 + 2 * NS)],
                   T0 + 2 * NS)
    assert control.rolled_back == ["shop.Scorer"]
    (inc,) = tracker.open.values()
    assert inc.service == "shop.Scorer" and inc.status == "mitigating"


def test_a_caller_whose_callees_stay_quiet_is_acted_on_after_the_wait(store: Store) -> None:
    tracker, control = _tracked(store)
    settle = int(CALLER_SETTLE_S * NS)
    tracker.update([_errors("shop", T0)], T0)
    tracker.update([_errors("shop", T0 + settle // 2)], T0 + settle // 2)
    assert control.rolled_back == []
    tracker.update([_errors("shop", T0 + settle)], T0 + settle)
    assert control.rolled_back == ["shop"]

"""What the planner proposes for an incident, given what the control plane reports: back to a
known-good version when there is one (a canary, or a release that replaced it entirely, as on
an attached Serve app), else scale for load, else nothing."""

from __future__ import annotations

from aiops.analytics.findings import Entity, FaultClass
from aiops.analytics.incidents import Incident, RankedCause
from aiops.control_status import ControlStatus
from aiops.remediation.actions import ActionKind
from aiops.remediation.remediator import plan


def _incident(version: str, fault: FaultClass = FaultClass.ERRORS) -> Incident:
    cause = RankedCause(Entity("chat", version), fault, 2.0, 0.9, ["trace_errors"], [])
    return Incident("inc-1", "chat", 0, 0, 0, causes=[cause])


def _status(stable: str | None, **weights: int) -> ControlStatus:
    return ControlStatus.model_validate({"models": {"chat": {"stable": stable, "versions": [
        {"version": v, "weight": w, "autoscaling": {"min_replicas": 1, "max_replicas": 2}}
        for v, w in weights.items()]}}})


def test_a_bad_canary_goes_back_to_the_stable_version() -> None:
    action = plan(_incident("v2"), _status("v1", v1=90, v2=10), 0)
    assert action is not None and action.kind is ActionKind.ROLLBACK
    assert action.version == "v2" and action.params == {"to": "v1"}


def test_a_bad_release_that_took_all_traffic_goes_back_to_the_last_healthy_one() -> None:
    action = plan(_incident("2"), _status("1", **{"2": 100, "1": 0}), 0)
    assert action is not None and action.kind is ActionKind.ROLLBACK
    assert action.params == {"to": "1"}


def test_trouble_on_the_stable_version_itself_is_not_a_rollback() -> None:
    assert plan(_incident("v1"), _status("v1", v1=100, v2=0), 0) is None
    scale = plan(_incident("v1", FaultClass.LATENCY), _status("v1", v1=100), 0)
    assert scale is not None and scale.kind is ActionKind.SCALE
    assert scale.params == {"min_replicas": 2, "max_replicas": 2}


def test_no_known_good_version_means_no_rollback() -> None:
    assert plan(_incident("2"), _status(None, **{"2": 100}), 0) is None
    # A stable version the control plane does not list is not one to return to.
    assert plan(_incident("2"), _status("0", **{"2": 100, "1": 0}), 0) is None


def test_a_lost_node_is_no_rollback_serve_reschedules_its_replicas() -> None:
    """Even on a canary: the version did nothing wrong, its node went away."""
    assert plan(_incident("v2", FaultClass.NODE), _status("v1", v1=90, v2=10), 0) is None


def test_trouble_while_a_lost_nodes_replicas_move_is_not_scaled_for() -> None:
    """The node loss stays among the causes when the latency it brings outranks it in a
    later round: still nothing to do but let Serve reschedule."""
    latency = RankedCause(Entity("chat", "v1", "chat#r1"), FaultClass.LATENCY, 3.0, 0.6,
                          ["trace_latency"], [])
    lost = RankedCause(Entity("chat", "v1"), FaultClass.NODE, 2.0, 0.4, ["node_lost"], [],
                       node="worker-1")
    inc = Incident("inc-1", "chat", 0, 0, 0, causes=[latency, lost])
    assert plan(inc, _status("v1", v1=100), 0) is None


def test_an_actions_target_reads_back_as_the_pair_it_was_written_from() -> None:
    from aiops.remediation.actions import Target

    for target in (Target("chat", "v2"), Target("chat"), Target("org@team/chat", "2026.12")):
        assert Target.parse(str(target)) == target
    assert str(Target("chat", "v2")) == "chat@v2" and str(Target("chat")) == "chat"
    assert Target.parse("") == Target("")

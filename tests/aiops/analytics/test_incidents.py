"""Incidents: deduplicated per service, ranked causes, open -> mitigating -> resolved."""

from __future__ import annotations

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker, Status, rank_causes
from aiops.analytics.topology import ServiceMap

NS = 1_000_000_000


def finding(detector: str, entity: Entity, fault: FaultClass, score: float = 2.0) -> Finding:
    return Finding(detector, entity, fault, score, 0, NS, f"{detector} on {entity}")


def test_findings_about_one_service_make_one_incident() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    v2 = Entity("echo", "v2")
    first = tracker.update([finding("trace_latency", v2, FaultClass.LATENCY)], 1 * NS)
    again = tracker.update([finding("slo_burn", v2, FaultClass.LATENCY)], 2 * NS)
    assert len(first) == 1 and first[0].status is Status.OPEN
    assert again == [] or again[0].incident_id == first[0].incident_id
    assert len(tracker.open) == 1


def test_an_incident_resolves_when_nothing_fires_for_a_while() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    inc = tracker.update([finding("trace_errors", Entity("echo", "v1"), FaultClass.ERRORS)],
                         0)[0]
    assert tracker.update([], 29 * NS) == []
    resolved = tracker.update([], 30 * NS)
    assert [(i.incident_id, i.status) for i in resolved] == [(inc.incident_id, Status.RESOLVED)]
    assert inc.closed_ns == 30 * NS and not tracker.open


def test_mitigating_is_set_by_an_action() -> None:
    tracker = IncidentTracker()
    inc = tracker.update([finding("slo_burn", Entity("echo", "v2"), FaultClass.LATENCY)], 0)[0]
    assert tracker.mark_mitigating(inc.incident_id, NS) is inc
    assert inc.status is Status.MITIGATING


def test_the_callee_ranks_above_its_caller() -> None:
    causes = rank_causes([finding("trace_latency", Entity("ingress"), FaultClass.LATENCY, 3.0),
                          finding("trace_latency", Entity("echo", "v2"), FaultClass.LATENCY,
                                  2.0)])
    assert [str(c.entity) for c in causes] == ["echo@v2", "ingress"]
    assert abs(sum(c.confidence for c in causes) - 1) < 1e-9


def test_cpu_contention_names_the_cause_behind_the_latency() -> None:
    causes = rank_causes([
        finding("trace_latency", Entity("echo", "v1"), FaultClass.LATENCY, 5.0),
        finding("ebpf_runq", Entity("echo", "v1", "r1"), FaultClass.CPU, 2.0)])
    assert (causes[0].entity, causes[0].fault_class) == (Entity("echo", "v1", "r1"),
                                                          FaultClass.CPU)
    assert causes[0].detectors == ["ebpf_runq", "trace_latency"]


def test_the_summary_quotes_the_top_causes_own_finding() -> None:
    # The caller's latency scores higher, but the callee ranks first (a map says who calls
    # whom): the text names the callee's figures, not the caller's.
    tracker = IncidentTracker(calls=ServiceMap(frozenset({("shop", "shop.Scorer")})))
    (inc,) = tracker.update([
        finding("trace_latency", Entity("shop", "1.0.0"), FaultClass.LATENCY, 9.0),
        finding("trace_errors", Entity("shop.Scorer", "2.0.0"), FaultClass.ERRORS, 2.0)], NS)
    assert str(inc.causes[0].entity) == "shop.Scorer@2.0.0"
    assert inc.summary == ("errors on shop.Scorer@2.0.0: trace_errors on "
                           "shop.Scorer@2.0.0")
    assert inc.row()["service"] == "shop.Scorer"


def test_along_a_chain_of_calls_the_deepest_firing_service_ranks_first() -> None:
    chain = ServiceMap(frozenset({("a", "b"), ("b", "c")}))
    causes = rank_causes([finding("trace_latency", Entity("a", "1"), FaultClass.LATENCY, 10.0),
                          finding("trace_latency", Entity("b", "1"), FaultClass.LATENCY, 5.0),
                          finding("trace_errors", Entity("c", "1"), FaultClass.ERRORS, 1.0)],
                         chain)
    assert causes[0].entity == Entity("c", "1")

"""Incidents ranked from their symptom: the service whose SLO burns, walked towards the callee
that failed (the same walk as offline RCA, ``aiops.analytics.rca.symptom``)."""

from __future__ import annotations

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker, rank_causes, symptom_of
from aiops.analytics.rca.model import Symptom
from aiops.analytics.slo import SLO_BURN
from aiops.analytics.topology import ServiceMap

NS = 1_000_000_000


def finding(detector: str, entity: Entity, fault: FaultClass, score: float = 2.0,
            about: str | None = None) -> Finding:
    return Finding(detector, entity, fault, score, 0, NS, f"{detector} on {entity}",
                   about=about)


def order(causes: list) -> list[str]:  # type: ignore[type-arg]
    return [str(c.entity) for c in causes]


def test_the_symptom_is_the_slo_that_burns_hardest() -> None:
    found = [finding("trace_latency", Entity("echo", "v1"), FaultClass.LATENCY, 9.0),
             finding(SLO_BURN, Entity("shop", "1"), FaultClass.ERRORS, 2.0),
             finding(SLO_BURN, Entity("echo", "v1"), FaultClass.LATENCY, 3.0)]
    assert symptom_of(found) == Symptom("echo", FaultClass.LATENCY)
    assert symptom_of(found[:1]) is None  # no SLO burns: the evidence alone ranks


def test_a_callee_failing_another_way_does_not_outrank_the_one_that_explains_the_symptom(
) -> None:
    # Users of the ingress see latency; echo is slow, embed fails louder but that is not
    # what the users saw.
    found = [finding(SLO_BURN, Entity("ingress"), FaultClass.LATENCY, 2.0),
             finding("trace_latency", Entity("echo", "v1"), FaultClass.LATENCY, 2.0),
             finding("trace_errors", Entity("embed", "v1"), FaultClass.ERRORS, 6.0)]
    assert order(rank_causes(found))[0] == "embed@v1"  # the evidence alone
    causes = rank_causes(found, symptom=symptom_of(found))
    assert order(causes) == ["echo@v1", "ingress", "embed@v1"]
    scores = [c.score for c in causes]
    assert scores == sorted(scores, reverse=True)  # score order is the verdict's order
    assert abs(sum(c.confidence for c in causes) - 1) < 1e-9


def test_a_cause_on_a_callee_carries_the_walk_whatever_the_symptoms_kind() -> None:
    chain = ServiceMap(frozenset({("shop", "scorer")}))
    found = [finding(SLO_BURN, Entity("shop", "1"), FaultClass.ERRORS, 8.0),
             finding("ebpf_oom", Entity("scorer", "2", "r1"), FaultClass.MEMORY, 1.5)]
    causes = rank_causes(found, chain, symptom_of(found))
    assert (causes[0].entity, causes[0].fault_class) == (Entity("scorer", "2", "r1"),
                                                          FaultClass.MEMORY)


def test_the_deepest_end_of_the_walk_leads() -> None:
    chain = ServiceMap(frozenset({("a", "b"), ("b", "c"), ("a", "d")}))
    found = [finding(SLO_BURN, Entity("a", "1"), FaultClass.LATENCY, 10.0),
             finding("trace_latency", Entity("b", "1"), FaultClass.LATENCY, 5.0),
             finding("trace_latency", Entity("c", "1"), FaultClass.LATENCY, 1.0),
             finding("trace_latency", Entity("d", "1"), FaultClass.LATENCY, 4.0)]
    assert order(rank_causes(found, chain, symptom_of(found))) == ["c@1", "d@1", "b@1", "a@1"]


def test_a_symptom_that_reaches_nothing_changes_nothing() -> None:
    found = [finding("trace_errors", Entity("echo", "v1"), FaultClass.ERRORS, 3.0),
             finding("trace_latency", Entity("embed", "v1"), FaultClass.LATENCY, 2.0)]
    lone = Symptom("nobody", FaultClass.LATENCY)
    assert order(rank_causes(found, symptom=lone)) == order(rank_causes(found))


def test_the_tracker_ranks_each_incident_from_its_own_symptom() -> None:
    # The ingress's findings join the incident of the model they served.
    tracker = IncidentTracker(calls=ServiceMap(frozenset({("chat", "chat.Tokenizer")})))
    (inc,) = tracker.update([
        finding(SLO_BURN, Entity("chat", "3"), FaultClass.LATENCY, 2.0),
        finding("trace_latency", Entity("chat", "3"), FaultClass.LATENCY, 2.5),
        finding("trace_errors", Entity("chat.Tokenizer", "1"), FaultClass.ERRORS, 4.0)], NS)
    # The tokenizer fails, but the users saw latency and the tokenizer is not slow: the
    # incident names the chat model, where the walk from the burning SLO ends.
    assert str(inc.causes[0].entity) == "chat@3"
    assert inc.summary.startswith("latency on chat@3")

"""Incidents: deduplicated per service, ranked causes, open -> mitigating -> resolved."""

from __future__ import annotations

import json

import pytest

from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.analytics.incidents import (
    IncidentEvidence,
    IncidentTracker,
    RankedCauseRecord,
    Status,
    rank_causes,
)
from aiops.analytics.topology import ServiceMap

NS = 1_000_000_000


def finding(detector: str, entity: Entity, fault: FaultClass, score: float = 2.0) -> Finding:
    """A finding tied to a change (a page: test_incident_pages.py says what else is)."""
    return Finding(detector, entity, fault, score, 0, NS, f"{detector} on {entity}",
                   change=f"{entity} released")


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
    assert resolved[0].closed_ns == 30 * NS and not tracker.open
    assert inc.status is Status.OPEN and inc.closed_ns is None  # a snapshot: as it was then


def test_mitigating_is_set_by_an_action() -> None:
    tracker = IncidentTracker()
    inc = tracker.update([finding("slo_burn", Entity("echo", "v2"), FaultClass.LATENCY)], 0)[0]
    marked = tracker.mark_mitigating(inc.incident_id, NS)
    assert marked is not None and marked.incident_id == inc.incident_id
    assert marked.status is Status.MITIGATING and marked.updated_ns == NS
    assert tracker.open["echo"].status is Status.MITIGATING
    assert tracker.mark_mitigating(inc.incident_id, 2 * NS) is None  # once


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


SHOP = ServiceMap(frozenset({("shop", "shop.Scorer")}))


def test_a_callers_page_waits_for_its_callees_spans_of_the_same_requests() -> None:
    """The caller's failures come in first (its exporter flushed first): within the caller
    grace they are held, and the callee firing makes the one incident the callee's from its
    first state; a caller whose callees stay quiet pages once the grace has passed."""
    tracker = IncidentTracker(calls=SHOP, caller_grace_s=5.0)
    shop = finding("trace_errors", Entity("shop", "2"), FaultClass.ERRORS, 3.0)
    assert tracker.update([shop], NS) == []
    assert tracker.update([shop], 3 * NS) == []
    scorer = finding("trace_errors", Entity("shop.Scorer", "2"), FaultClass.ERRORS, 2.0)
    (inc,) = tracker.update([shop, scorer], 4 * NS)
    assert inc.row()["service"] == "shop.Scorer"
    assert {str(c.entity) for c in inc.causes} == {"shop@2", "shop.Scorer@2"}

    alone = IncidentTracker(calls=SHOP, caller_grace_s=5.0)
    assert alone.update([shop], NS) == []
    assert alone.update([shop], 5 * NS) == []
    (own,) = alone.update([shop], 6 * NS)
    assert own.row()["service"] == "shop"


def test_a_callers_incident_opened_first_becomes_its_callees_once_that_fires() -> None:
    # The ingress's users see the failures first (past the caller grace, here none); an
    # action may already name its incident.
    tracker = IncidentTracker(calls=SHOP, caller_grace_s=0)
    shop = finding("trace_errors", Entity("shop", "2"), FaultClass.ERRORS, 3.0)
    (first,) = tracker.update([shop], NS)
    assert first.service == "shop"
    tracker.mark_mitigating(first.incident_id, NS + 1)
    scorer = finding("trace_errors", Entity("shop.Scorer", "2"), FaultClass.ERRORS, 2.0)
    (later,) = tracker.update([shop, scorer], 2 * NS)
    assert later.incident_id == first.incident_id and later.status is Status.MITIGATING
    assert later.row()["service"] == "shop.Scorer"
    assert str(later.causes[0].entity) == "shop.Scorer@2"
    assert list(tracker.open) == ["shop.Scorer"]


def test_two_open_incidents_of_a_caller_and_its_callee_become_the_older_one() -> None:
    tracker = IncidentTracker()  # no service map yet: one incident each
    (caller,) = tracker.update([finding("trace_errors", Entity("shop", "2"),
                                        FaultClass.ERRORS)], NS)
    (callee,) = tracker.update([finding("trace_errors", Entity("shop.Scorer", "2"),
                                        FaultClass.ERRORS)], 2 * NS)
    tracker.calls = SHOP  # the map, learnt from traces
    changed = {i.incident_id: i for i in tracker.update([], 3 * NS)}
    assert changed[callee.incident_id].status is Status.RESOLVED
    kept = changed[caller.incident_id]
    assert kept.status is Status.OPEN and kept.service == "shop.Scorer"
    assert {str(c.entity) for c in kept.causes} == {"shop@2", "shop.Scorer@2"}
    assert str(kept.causes[0].entity) == "shop.Scorer@2"
    assert list(tracker.open) == ["shop.Scorer"]


def test_along_a_chain_of_calls_the_deepest_firing_service_ranks_first() -> None:
    chain = ServiceMap(frozenset({("a", "b"), ("b", "c")}))
    causes = rank_causes([finding("trace_latency", Entity("a", "1"), FaultClass.LATENCY, 10.0),
                          finding("trace_latency", Entity("b", "1"), FaultClass.LATENCY, 5.0),
                          finding("trace_errors", Entity("c", "1"), FaultClass.ERRORS, 1.0)],
                         chain)
    assert causes[0].entity == Entity("c", "1")


def test_the_evidence_column_reads_back_as_it_was_written() -> None:
    v2 = Entity("echo", "v2", "r1")
    trace = v2.evidence(EvidenceKind.TRACE, "ab12", FaultClass.CPU, "runq_ms", 30, 2, 4.5)
    cpu = Finding("ebpf_runq", v2, FaultClass.CPU, 2.0, 5, NS, "runq", [trace])
    (inc,) = IncidentTracker().update([cpu, finding("trace_latency", Entity("echo", "v2"),
                                                    FaultClass.LATENCY, 3.0)], NS,
                                      context=lambda i: [{"kind": "change", "at": 1}])
    row = inc.row()
    evidence = IncidentEvidence.parse(row["evidence"])
    assert evidence == inc.evidence() == IncidentEvidence.parse(json.loads(row["evidence"]))
    top = evidence.top
    assert isinstance(top, RankedCauseRecord)
    assert (top.entity, top.service, top.version, top.replica, top.fault_class) == (
        "echo@v2/r1", "echo", "v2", "r1", "cpu")
    assert top.evidence[0].id == "ab12" and top.evidence[0].observed == 30
    assert evidence.onset_ns == 0 and evidence.context == [{"kind": "change", "at": 1}]
    assert [f["detector"] for f in evidence.findings] == ["ebpf_runq", "trace_latency"]
    # The text is what readers parsed before the contract: the same keys, by the same names.
    assert json.loads(evidence.to_json()) == json.loads(row["evidence"])
    assert json.loads(row["evidence"])["root_causes"][0] == inc.causes[0].to_json()


def test_evidence_parses_partial_rows_and_refuses_what_is_not_evidence() -> None:
    assert IncidentEvidence.parse(None) == IncidentEvidence() == IncidentEvidence.parse("")
    old = IncidentEvidence.parse({"root_causes": [{"entity": "echo@v1", "score": "0.5"}]})
    assert old.top is not None and old.top.score == 0.5 and old.onset_ns is None
    with pytest.raises(ValueError):
        IncidentEvidence.parse('{"root_causes": [{"score": 1}]}')  # no entity
    with pytest.raises(ValueError):
        IncidentEvidence.parse("not json")

"""An incident is a page: it opens only for what users feel (an SLO burning, a regression tied
to a change, a failure that kills what serves them), once per fault; other findings are held
and enrich the incident that opens; a mitigated incident resolves on when its last bad
observation ended, and the window's stale spans do not open it again."""

from __future__ import annotations

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker, Status, pages
from aiops.analytics.topology import ServiceMap
from aiops.identity import PROXY_SERVICE

NS = 1_000_000_000
SCORER_V2 = Entity("shop.Scorer", "cfg-2")


def finding(detector: str, entity: Entity, fault: FaultClass, at_s: float = 0.0,
            change: str | None = None, last_s: float | None = None) -> Finding:
    return Finding(detector, entity, fault, 2.0, int(at_s * NS), int(at_s * NS) + NS,
                   f"{detector} on {entity}", change=change,
                   last_ns=None if last_s is None else int(last_s * NS))


def test_a_tail_on_a_release_that_has_served_for_long_is_a_finding_not_a_page() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    tail = finding("trace_latency", Entity("shop.Scorer", "cfg-1"), FaultClass.LATENCY)
    for t in range(0, 60, 5):
        assert tracker.update([tail], t * NS) == []
    assert not tracker.open and tracker.held() and not pages(tail)


def test_a_regression_tied_to_a_change_pages_with_the_findings_held_before_it() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    cpu = finding("ebpf_runq", Entity("shop.Scorer", "cfg-2"), FaultClass.CPU, at_s=1)
    assert tracker.update([cpu], 2 * NS) == []
    errors = finding("trace_errors", SCORER_V2, FaultClass.ERRORS, at_s=3,
                     change="shop.Scorer@cfg-2 first served 4 s ago, after cfg-1")
    [inc] = tracker.update([errors], 4 * NS)
    assert inc.service == "shop.Scorer" and inc.severity == "page"
    assert {k[0] for k in inc.findings} == {"ebpf_runq", "trace_errors"}
    assert inc.onset_ns == 1 * NS  # the held finding's onset is the incident's
    assert not tracker.held()


def test_burns_and_killed_replicas_page_without_a_change() -> None:
    v1 = Entity("embed", "v1")
    assert pages(finding("slo_burn", v1, FaultClass.LATENCY))
    assert pages(finding("ebpf_exit", v1, FaultClass.CRASH))
    assert not pages(finding("ebpf_runq", v1, FaultClass.CPU))
    assert not pages(finding("log_template", v1, FaultClass.ERRORS))


def test_the_proxy_and_the_ingress_join_the_incident_of_the_deployment_behind_them() -> None:
    calls = ServiceMap(frozenset({("shop", "shop.Scorer"), ("shop", "shop.Tokenizer")}))
    tracker = IncidentTracker(resolve_after_s=30, calls=calls)
    proxy = finding("trace_errors", Entity(PROXY_SERVICE), FaultClass.ERRORS, at_s=1)
    ingress = finding("trace_errors", Entity("shop", "cfg-2"), FaultClass.ERRORS, at_s=1,
                      change="shop@cfg-2 first served 2 s ago, after cfg-1")
    # The clients' view fires first: held, no incident of the proxy's own.
    assert tracker.update([proxy], 2 * NS) == []
    scorer = finding("trace_errors", SCORER_V2, FaultClass.ERRORS, at_s=2,
                     change="shop.Scorer@cfg-2 first served 3 s ago, after cfg-1")
    changed = tracker.update([proxy, ingress, scorer], 3 * NS)
    assert [(i.service, i.causes[0].entity) for i in changed] == [("shop.Scorer", SCORER_V2)]
    assert {k[1].service for k in changed[0].findings} == {PROXY_SERVICE, "shop",
                                                           "shop.Scorer"}
    assert list(tracker.open) == ["shop.Scorer"]


def test_a_mitigated_incident_resolves_once_its_bad_spans_stop_not_when_they_age_out() -> None:
    tracker = IncidentTracker(resolve_after_s=30, recovered_after_s=10)
    bad = "shop.Scorer@cfg-2 first served 3 s ago, after cfg-1"
    [inc] = tracker.update([finding("trace_errors", SCORER_V2, FaultClass.ERRORS, 0, bad,
                                    last_s=1)], 2 * NS)
    assert tracker.mark_mitigating(inc.incident_id, 3 * NS) is not None
    # Rolled back at 3 s; the last failed span ended at 5 s. The detector's window still
    # holds it, so the finding fires on, about nothing newer.
    for t in range(6, 15):
        tracker.update([finding("trace_errors", SCORER_V2, FaultClass.ERRORS, 0, bad, last_s=5)],
                       t * NS)
        assert tracker.open["shop.Scorer"].status is Status.MITIGATING
    [resolved] = tracker.update([finding("trace_errors", SCORER_V2, FaultClass.ERRORS, 0, bad,
                                         last_s=5)], 15 * NS)
    assert resolved.status is Status.RESOLVED and resolved.closed_ns == 15 * NS
    # The same spans in the window are not a new fault; a failure after them is.
    assert tracker.update([finding("trace_errors", SCORER_V2, FaultClass.ERRORS, 0, bad,
                                   last_s=5)], 16 * NS) == []
    [again] = tracker.update([finding("trace_errors", SCORER_V2, FaultClass.ERRORS, 16, bad,
                                      last_s=17)], 18 * NS)
    assert again.status is Status.OPEN and again.incident_id != inc.incident_id


def test_a_loud_tail_on_the_proxy_never_outranks_the_deployment_that_fails() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    proxy = Finding("trace_latency", Entity(PROXY_SERVICE), FaultClass.LATENCY, 40.0, 0, NS,
                    "7 of 137 spans slower than 125 ms")
    scorer = finding("trace_errors", SCORER_V2, FaultClass.ERRORS, at_s=0,
                     change="shop.Scorer@cfg-2 first served 5 s ago, after cfg-1")
    [inc] = tracker.update([proxy, scorer], NS)
    assert inc.service == "shop.Scorer" and inc.causes[0].entity == SCORER_V2
    assert inc.row()["model_version"] == "cfg-2"

"""Trace anomalies: latency and errors per operation, against its own past or its siblings."""

from __future__ import annotations

from aiops.analytics.findings import Entity, FaultClass
from aiops.analytics.traces import TraceThresholds, trace_findings
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_spans, span, traffic

T = TraceThresholds(window_s=20, baseline_s=600)


def test_steady_latency_is_not_an_anomaly(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50)
    assert trace_findings(store, T0, T) == []


def test_a_latency_step_fires_for_the_version_and_operation(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 400)  # the change point: 20 s ago, 8x slower
    found = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert [(f.entity.version, f.fault_class) for f in found] == [("v1", FaultClass.LATENCY)]
    assert found[0].score > 1
    assert any(e.kind == "trace" for e in found[0].evidence)


def test_a_slowdown_its_slo_still_calls_fast_is_not_a_finding(store: Store) -> None:
    # 8x slower (a neighbour's burst on a busy node), yet 400 ms is within echo's 500 ms SLO.
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 400)
    assert trace_findings(store, T0, T, slow_ms={"echo": 500}) == []
    found = trace_findings(store, T0, T, slow_ms={"echo": 300})  # beyond it: an incident
    assert [(f.entity.service, f.fault_class) for f in found
            if f.entity.service == "echo"] == [("echo", FaultClass.LATENCY)]


def test_a_canarys_tail_beyond_its_slo_is_found_on_two_spans(store: Store) -> None:
    # The stable version is slowed too (2x: contention on the node), so the SLO floor holds.
    traffic(store, T0 - 300 * NS, 280, 5, 50, version="v1")
    traffic(store, T0 - 20 * NS, 20, 5, 100, version="v1")
    add_spans(store, [span(T0 - 8 * NS, 700, version="v2"), span(T0 - 4 * NS, 700,
                                                                 version="v2")])
    found = trace_findings(store, T0, T, slow_ms={"echo": 500})
    assert [(f.entity.version, f.fault_class) for f in found
            if f.entity.service == "echo"] == [("v2", FaultClass.LATENCY)]
    assert [f for f in trace_findings(store, T0, T, slow_ms={"echo": 800})
            if f.entity.service == "echo"] == []


def test_a_canary_far_slower_than_its_unslowed_sibling_is_found_within_its_slo(
        store: Store) -> None:
    # v1 serves at its usual speed in the same window: not contention, v2's own regression.
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    add_spans(store, [span(T0 - 8 * NS, 700, version="v2"), span(T0 - 4 * NS, 700,
                                                                 version="v2")])
    found = trace_findings(store, T0, T, slow_ms={"echo": 800})
    assert [(f.entity.version, f.fault_class) for f in found] == [("v2", FaultClass.LATENCY)]


def test_a_slow_canary_is_compared_with_its_stable_sibling(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    traffic(store, T0 - 20 * NS, 20, 1, 350, version="v2")  # new: no history of its own
    found = {(f.entity.service, f.entity.version, f.fault_class)
             for f in trace_findings(store, T0, T)}
    assert ("echo", "v2", FaultClass.LATENCY) in found
    assert ("echo", "v1", FaultClass.LATENCY) not in found


def test_an_error_burst_fires_errors(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 50, status=500)
    found = {(f.entity.service, f.fault_class) for f in trace_findings(store, T0, T)}
    assert ("echo", FaultClass.ERRORS) in found


def test_one_slow_request_is_not_an_anomaly(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 3 * NS, 1, 1, 900)
    assert trace_findings(store, T0, T) == []


def test_two_slow_requests_among_many_are_not_an_anomaly(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50)
    add_spans(store, [span(T0 - 5 * NS, 900), span(T0 - 4 * NS, 900)])
    assert trace_findings(store, T0, T) == []


def test_a_canarys_first_two_requests_far_beyond_its_siblings_tail_fire(store: Store) -> None:
    # v2 served its gate requests normally (a few spans of history of its own), then both of
    # its first routed requests are slower than anything v1 served: below min_spans, the
    # tail test finds it.
    traffic(store, T0 - 300 * NS, 300, 2, 50, version="v1")
    traffic(store, T0 - 60 * NS, 1, 5, 50, version="v2")
    add_spans(store, [span(T0 - 9 * NS, 5050, version="v2"),  # began before the window
                      span(T0 - 7 * NS, 5050, version="v2")])
    found = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert [(f.entity.version, f.fault_class) for f in found] == [("v2", FaultClass.LATENCY)]
    assert "2 of 2 spans slower than" in found[0].summary


def test_a_canarys_first_failures_fire_errors_on_few_spans(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 2, 50, version="v1")
    add_spans(store, [span(T0 - 4 * NS, 20, version="v2", status=500),
                      span(T0 - 3 * NS, 20, version="v2", status=500),
                      span(T0 - 2 * NS, 50, version="v2")])
    found = {(f.entity.service, f.entity.version, f.fault_class)
             for f in trace_findings(store, T0, T)}
    assert ("echo", "v2", FaultClass.ERRORS) in found


def test_one_failure_of_few_is_not_an_error_burst(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 2, 50, version="v1")
    add_spans(store, [span(T0 - 4 * NS, 20, version="v2", status=500),
                      span(T0 - 2 * NS, 50, version="v2")])
    assert trace_findings(store, T0, T) == []


def test_a_release_failing_from_its_first_request_keeps_firing_against_its_predecessor(
        store: Store) -> None:
    # v1 served cleanly until v2 replaced it 120 s ago; v2 has failed 3 in 10 ever since, so
    # its own history fails as often as its window: judged against that it would look
    # normal (and its incident resolve while it still fails). The best recent version is
    # the reference.
    traffic(store, T0 - 400 * NS, 280, 2, 50, version="v1")
    traffic(store, T0 - 120 * NS, 120, 3, 50, version="v2")
    traffic(store, T0 - 120 * NS + NS // 2, 120, 1, 50, version="v2", status=500)
    errors = [f for f in trace_findings(store, T0, T) if f.fault_class is FaultClass.ERRORS
              and f.entity == Entity("echo", "v2")]
    assert errors and "25% of" in errors[0].summary and "vs 0% normally" in errors[0].summary


def test_a_few_ms_of_scheduling_jitter_on_a_short_operation_is_not_an_anomaly(
        store: Store) -> None:
    # A 5 ms operation: 7 of its window's spans take 16-20 ms (preempted once or twice on a
    # busy node), its median unchanged. 3x its median, yet within two scheduler periods.
    traffic(store, T0 - 300 * NS, 300, 5, 3)  # 3-7 ms, median 5 ms
    rows = [span(T0 - 15 * NS + i * NS // 2, 16 + i % 5) for i in range(7)]
    add_spans(store, rows)
    assert [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"] == []


def _open(store: Store, at_ns: int, ages_s: list[float], version: str = "v2") -> None:
    """A replica's report of its oldest open requests (serve.inflight), one point per rank."""
    from tests.aiops.analytics.telemetry import add_points

    add_points(store, [{"time": at_ns, "name": "aiops.serve.in_flight.age", "type": "gauge",
                        "value": age, "service_name": "echo",
                        "attributes": {"gen_ai.operation.name": "chat",
                                       "gen_ai.request.model": "echo",
                                       "aiops.model.version": version,
                                       "aiops.in_flight.rank": rank}}
                       for rank, age in enumerate(ages_s)])


def test_a_canarys_requests_still_open_past_the_slow_level_are_found_before_they_end(
        store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    _open(store, T0 - NS, [1.5, 1.2])  # two v2 requests open 1.2-1.5 s, none ended yet
    found = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert [(f.entity.version, f.fault_class) for f in found] == [("v2", FaultClass.LATENCY)]
    assert found[0].change is not None and "echo@v2" in found[0].change
    assert found[0].last_ns == T0  # still going: evidence of now
    # Reports that are no longer fresh are not counted.
    assert [f for f in trace_findings(store, T0 + 5 * NS, T)
            if f.entity.version == "v2"] == []


def test_one_slow_request_reported_open_and_then_ended_is_counted_once(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    slow = span(T0 - 3 * NS, 2500, version="v2")  # started T0-3 s, ended T0-0.5 s
    add_spans(store, [slow])
    _open(store, T0 - NS, [2.0])  # its report 1 s before the end: the same request
    assert [f for f in trace_findings(store, T0, T) if f.entity.version == "v2"] == []


def test_a_version_is_a_change_in_its_first_minutes_only(store: Store) -> None:
    traffic(store, T0 - 500 * NS, 100, 5, 50, version="v1")
    traffic(store, T0 - 400 * NS, 400, 5, 50, version="v2")  # replaced v1 400 s ago
    for end in (T0, T0 - 250 * NS):  # the same regression, 400 s and 150 s after v2 came
        add_spans(store, [span(end - 9 * NS + k * NS // 20, 900, version="v2")
                          for k in range(160)])  # most of the window's requests
    [late] = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert late.entity.version == "v2" and late.change is None  # 400 s on: not a change
    [early] = [f for f in trace_findings(store, T0 - 250 * NS, T)
               if f.entity.service == "echo"]
    assert early.change is not None and "after v1" in early.change


def _configured(rows: list[dict[str, object]], digest: str) -> list[dict[str, object]]:
    """Spans of a replica running the in-place config ``digest`` (serve.replica stamps it)."""
    import json

    for r in rows:
        r["attributes"] = json.dumps({**json.loads(str(r["attributes"])),
                                      "aiops.model.config_digest": digest})
    return rows


def _slower_after(store: Store, digest: str) -> None:
    """echo v1 at 50 ms with config aaaa1111 for 5 minutes, then 8x slower for the last 20 s
    under config ``digest``."""
    add_spans(store, _configured([span(T0 - 300 * NS + k * NS // 5, 50) for k in range(1400)],
                                 "aaaa1111"))
    add_spans(store, _configured([span(T0 - 20 * NS + k * NS // 5, 400) for k in range(100)],
                                 digest))


def test_a_regression_after_an_in_place_config_change_is_tied_to_it(store: Store) -> None:
    # The same version throughout; its config changed in place 20 s ago (a user_config
    # release), and its requests got 8x slower with it.
    _slower_after(store, "bbbb2222")
    [slow] = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert slow.entity.version == "v1" and slow.change is not None
    assert "config changed in place" in slow.change and "bbbb2222" in slow.change


def test_the_same_regression_with_no_change_behind_it_is_tied_to_none(store: Store) -> None:
    _slower_after(store, "aaaa1111")
    [slow] = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert slow.change is None


def test_a_regression_that_came_with_a_change_is_found_inside_a_generous_slo(
        store: Store) -> None:
    # 8x slower after an in-place config change, yet within echo's 500 ms objective: a
    # regression tied to the change, not contention (which the floor is for).
    _slower_after(store, "bbbb2222")
    [slow] = [f for f in trace_findings(store, T0, T, slow_ms={"echo": 500})
              if f.entity.service == "echo"]
    assert slow.fault_class is FaultClass.LATENCY and slow.change is not None


def test_a_burst_slowing_a_few_of_many_requests_is_not_a_tail_finding(store: Store) -> None:
    # A neighbour's burst on a busy node: 8 of 180 requests in the window 10x slower at once,
    # the median unmoved. The tail test's odds take them as independent; they are not.
    traffic(store, T0 - 300 * NS, 290, 18, 20, version="v1")
    add_spans(store, [span(T0 - 10 * NS + k * NS // 18, 200 if k % 22 == 0 else 20)
                      for k in range(180)])
    assert [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"] == []

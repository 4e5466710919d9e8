"""Questions about the telemetry itself: each figure comes from the store, with the SQL it
came from; a question the store has no data for says so instead of guessing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agents.agent import Agent, Answer
from agents.tools import Toolbox
from aiops.analytics.slo import Objective
from aiops.capacity import Capacity
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_logs, add_points, add_spans, log, span


def _requests(store: Store, start_ns: int, n: int, every_ms: int, duration_ms: float,
              version: str = "v1", status: int = 200, model: str = "echo") -> list[float]:
    """``n`` requests as the stack records them: an ingress SERVER span (the root) and the
    replica's span under it. Returns the ingress durations (ms)."""
    rows, durations = [], []
    for i in range(n):
        t = start_ns + i * every_ms * 1_000_000
        d = duration_ms + (i % 7) * 3
        root = span(t, d, model, version, "ingress", status)
        child = span(t, d - 1, model, version, status=status)
        child["trace_id"], child["parent_span_id"] = root["trace_id"], root["span_id"]
        rows += [root, child]
        durations.append(d)
    add_spans(store, rows)
    return durations


def _ask(store: Store, question: str, **box: Any) -> Answer:
    return Agent(Toolbox(store, now=lambda: T0, **box)).ask(question)


def test_the_percentile_asked_for_is_the_one_answered_with_its_sql(store: Store) -> None:
    durations = _requests(store, T0 - 300 * NS, 200, 1000, 40)
    _requests(store, T0 - 1800 * NS, 50, 1000, 900)  # before the window: not counted
    a = _ask(store, "what is the p99 latency of echo over the last 10 minutes?")
    assert (a.intent.kind, a.intent.percentiles, a.intent.minutes) == ("latency", [99.0], 10)
    assert a.report is not None and len(a.report.rows) == 1
    row = a.report.rows[0]
    assert row["requests"] == 200
    assert row["p99_ms"] == round(float(np.percentile(durations, 99)), 1)
    assert "p99" in a.text and "p95" not in a.text
    assert "quantile_cont(duration_ns, 0.99)" in a.text and "```sql" in a.text


def test_a_replicas_warm_up_requests_are_not_users_requests(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 20, 1000, 40)
    warm = span(T0 - 200 * NS, 3000)  # a replica warming itself: a root span, 3 s
    warm["attributes"] = warm["attributes"][:-1] + ', "aiops.warmup": "true"}'
    add_spans(store, [warm])
    a = _ask(store, "what is the p99 latency of echo over the last 10 minutes?")
    assert a.report is not None and a.report.rows[0]["requests"] == 20
    assert a.report.rows[0]["p99_ms"] < 1000


def test_a_servers_start_up_span_is_not_a_request(store: Store) -> None:
    # vLLM's own exporter: requests are `llm_request` SERVER roots named by the service only;
    # loading the model is an INTERNAL root of 17 s.
    rows = []
    for i in range(20):
        r = span(T0 - 300 * NS + i * NS, 40 + i)
        r.update(name="llm_request", kind="server", attributes="{}")
        rows.append(r)
    loading = span(T0 - 400 * NS, 17_000)
    loading.update(name="Overall Loading", kind="internal", attributes="{}")
    add_spans(store, [*rows, loading])
    a = _ask(store, "what is the p99 latency of echo over the last 10 minutes?")
    assert a.report is not None and a.report.rows[0]["requests"] == 20
    assert a.report.rows[0]["p99_ms"] < 100


def test_processes_of_one_server_are_not_replicas(store: Store) -> None:
    # One vLLM server exports from three processes, each with the OpenTelemetry SDK's own
    # random service.instance.id: no Serve replica among them.
    rows = []
    for i in range(30):
        r = span(T0 - 300 * NS + i * NS, 40)
        r.update(name="llm_request", kind="server", attributes="{}",
                 resource_attributes=f'{{"service.instance.id": "proc-{i % 3}"}}')
        rows.append(r)
    add_spans(store, rows)
    a = _ask(store, "what is the p99 latency of echo per replica over the last 10 minutes?")
    assert a.intent.by == "replica"
    assert a.report is not None and a.report.rows == []


def test_a_chinese_question_reads_the_same(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 100, 1000, 40)
    a = _ask(store, "echo过去十分钟的P99延迟是多少?")
    assert (a.intent.kind, a.intent.model, a.intent.percentiles, a.intent.minutes) == (
        "latency", "echo", [99.0], 10)
    assert a.report is not None and a.report.rows[0]["requests"] == 100


def test_versions_side_by_side(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 100, 1000, 40, "v1")
    slow = _requests(store, T0 - 100 * NS, 40, 1000, 400, "v2")
    a = _ask(store, "compare v1 and v2 of echo")
    assert a.report is not None
    rows = {r["version"]: r for r in a.report.rows}
    assert rows["v2"]["p99_ms"] == round(float(np.percentile(slow, 99)), 1)
    assert "p99 of v2 is" in a.text


def test_the_slowest_and_the_failed_traces_by_id(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 50, 1000, 40)
    _requests(store, T0 - 60 * NS, 3, 1000, 5000, status=503)
    slowest = _ask(store, "show me the slowest trace in the last 5 minutes")
    failed = _ask(store, "which requests to echo failed in the last 5 minutes?")
    assert slowest.report is not None and failed.report is not None
    assert slowest.report.rows[0]["duration_ms"] >= 5000
    assert failed.intent.order == "failed" and failed.report.totals["matching"] == 3
    assert slowest.report.rows[0]["trace_id"] in slowest.text


def test_error_logs_as_templates_and_only_the_new_ones(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    add_logs(store, [log(T0 - 3000 * NS + i * NS, f"timeout after {i} ms", 17)
                     for i in range(20)])  # an hour ago: old
    add_logs(store, [log(T0 - 200 * NS + i * NS, f"timeout after {i} ms", 17)
                     for i in range(5)] +
             [log(T0 - 100 * NS + i * NS, f"CUDA error {i} on device", 17) for i in range(3)])
    top = _ask(store, "top error logs of echo in the last 5 minutes")
    new = _ask(store, "any new log templates on echo in the last 5 minutes?")
    assert top.report is not None and top.report.totals["records"] == 8
    assert new.report is not None and new.intent.new_only
    assert [r["template"] for r in new.report.rows] == ["CUDA error <*> on device"]


def test_what_changed_names_the_canary(store: Store) -> None:
    _requests(store, T0 - 1800 * NS, 1800, 1000, 40, "v1")
    _requests(store, T0 - 120 * NS, 100, 1000, 40, "v2")
    a = _ask(store, "what changed in the last 10 minutes?")
    assert a.report is not None
    assert [r["change"].split()[0] for r in a.report.rows
            if "started serving" in r["change"]] == ["echo@v2"]


def test_the_agents_own_model_answering_its_first_question_is_not_a_change(
        store: Store) -> None:
    """The agent's own LLM (``aiops-agent``) serves its first request when the first question
    is asked: that is aiops' own traffic, not "a deploy or canary" of the team's."""
    _requests(store, T0 - 1800 * NS, 1800, 1000, 40, "v1")
    _requests(store, T0 - 60 * NS, 2, 1000, 900, "v1", model="aiops-agent")
    a = _ask(store, "what changed in the last 10 minutes?", own_models=("aiops-agent",))
    assert a.report is not None
    assert not [r for r in a.report.rows if "aiops-agent" in r["change"]]
    assert "No change seen" in a.text and "aiops' own agent" in a.text


def test_error_budget_left_from_the_declared_slo(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 95, 1000, 40)
    _requests(store, T0 - 200 * NS, 5, 1000, 40, status=500)
    a = _ask(store, "how much error budget is left for echo?",
             objectives=[Objective("echo", 1000, 0.05, 0.10)])
    assert a.report is not None
    errors = next(r for r in a.report.rows if "failing" in r["objective"])
    # 5 of 100 failed against a 10% budget: half of it is left.
    assert (errors["bad"], errors["requests"], errors["budget_left"]) == (5, 100, 0.5)


def test_what_the_store_cannot_answer_is_said_not_guessed(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    a = _ask(store, "is echo saturated? what about its GPU?")
    assert a.report is not None
    assert any("GPU" in g for g in a.report.gaps)
    assert any("KV-cache" in g for g in a.report.gaps)
    empty = _ask(store, "p95 latency of echo v7")
    assert empty.report is not None and empty.report.rows == []
    assert any("no requests to echo v7" in g for g in empty.report.gaps)
    assert "p95" not in " ".join(empty.report.lines)


def test_a_question_about_why_is_still_an_investigation(store: Store) -> None:
    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    a = _ask(store, "why did the p99 of echo jump?")
    # Not a latency table: an investigation, which with no incident reads the requests.
    assert a.intent.kind == "investigate" and a.report is not None
    assert a.report.kind == "investigate" and a.report.lines[0].startswith("No incident")


def test_the_terminal_shows_the_figures_the_gaps_and_the_sql(store: Store) -> None:
    from rich.console import Console

    from agents.cli import render

    _requests(store, T0 - 300 * NS, 20, 1000, 40)
    out = Console(width=120, record=True)
    render(_ask(store, "p99 latency of echo").model_dump(mode="json"), out)
    render(_ask(store, "roll back echo").model_dump(mode="json"), out)
    shown = out.export_text()
    assert "p99" in shown and "SELECT" in shown and "quantile_cont" in shown
    # What happened to the action, in words, not a bare "-> error".
    assert "Not done: cannot roll back echo: only v1 has served it" in shown


# -- "why" with no incident (agents/questions/why.py) ------------------------------------------


def test_why_without_an_incident_shows_the_slow_minutes_and_the_span_that_grew(
        store: Store) -> None:
    """The chat model ran 1.5 s slower for 90 s, under its SLO: no incident, yet "why did it
    get slow?" is answered from its requests, not with "no incident"."""
    _requests(store, T0 - 900 * NS, 780, 1000, 40)  # 13 usual minutes
    _requests(store, T0 - 120 * NS, 90, 1000, 1540)  # then 90 s at +1.5 s
    a = _ask(store, "why did echo get slow?")
    assert a.intent.kind == "investigate" and a.report is not None
    text = "\n".join(a.report.lines)
    assert a.report.lines[0].startswith("No incident on echo in the last 15 minutes, but it "
                                        "ran slow for 2 minute(s)")
    assert "against 4" in a.report.lines[0]  # the usual median, ~40 ms
    assert "echo `chat echo`" in text  # the replica's span grew
    slow = [r for r in a.report.rows if r["slow"]]
    assert len(slow) == 2 and all(r["p50_ms"] > 1500 for r in slow)
    assert a.report.queries and all(q.error is None for q in a.report.queries)
    assert a.text.count("```sql") == len(a.report.queries)


def test_why_without_an_incident_says_when_nothing_ran_slow(store: Store) -> None:
    _requests(store, T0 - 900 * NS, 800, 1000, 40)
    a = _ask(store, "why is echo slow?")
    assert a.report is not None
    assert a.report.lines[0].startswith("No incident on echo in the last 15 minutes, and it "
                                        "did not run slow")
    assert "Spans that grew" not in "\n".join(a.report.lines)


def test_why_without_an_incident_lists_what_changed_in_the_window(store: Store) -> None:
    _requests(store, T0 - 900 * NS, 780, 1000, 40)
    _requests(store, T0 - 120 * NS, 90, 1000, 1540, version="v2")  # a new version, slow
    a = _ask(store, "what happened to echo? it got slow")
    text = "\n".join(a.report.lines) if a.report else ""
    assert "ran slow" in text and "echo@v2 started serving" in text


# -- the KV-cache hit rate -------------------------------------------------------------------


def _counter(name: str, t: int, value: float, model: str) -> dict[str, Any]:
    return {"time": t, "name": name, "type": "gauge", "value": value,
            "attributes": {"gen_ai.request.model": model, "aiops.model.version": "v1"}}


def test_the_kv_cache_hit_rate_comes_from_the_engines_prefix_cache_counters(
        store: Store) -> None:
    """vLLM counts prefix-cache lookups and hits: the hit rate is their growth in the window
    (not the cache's use, which says how full it is)."""
    add_points(store, [
        *(_counter("vllm.prefix_cache.queries", T0 - (300 - 30 * k) * NS, 1000.0 + 400 * k,
                   "qwen") for k in range(10)),
        *(_counter("vllm.prefix_cache.hits", T0 - (300 - 30 * k) * NS, 200.0 + 100 * k, "qwen")
          for k in range(10))])
    a = _ask(store, "what is the KV cache hit rate of qwen?")
    assert a.intent.kind == "saturation" and a.report is not None
    line = next(x for x in a.report.lines if "hit rate" in x)
    assert "qwen@v1 KV-cache hit rate: 25.0% (900 of 3600" in line


def test_a_kv_cache_hit_rate_nobody_measures_is_said_to_be_unmeasured(store: Store) -> None:
    """llama.cpp exports KV-cache use but no hit counters: the answer says the rate is not
    measured rather than offering the use as if it were the rate."""
    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    add_points(store, [{"time": T0 - 60 * NS, "name": "aiops.model.kv_cache.usage",
                        "type": "gauge", "value": 0.4,
                        "attributes": {"gen_ai.request.model": "echo",
                                       "aiops.model.version": "v1"}}])
    a = _ask(store, "what is the KV cache hit rate of echo?")
    assert a.report is not None
    assert a.intent.model == "echo"
    assert any(g.startswith("KV-cache hit rate: not measured for echo") for g in a.report.gaps)
    assert any("KV-cache / context use: 40%" in x for x in a.report.lines)  # the use, as use
    assert not any("hit rate:" in x for x in a.report.lines)


# -- memory, against what the spec reserves ------------------------------------------------------


def _rss(t: int, component: str, pid: str, mb: float) -> dict[str, Any]:
    return {"time": t, "name": "ray_component_rss_mb", "type": "gauge", "value": mb,
            "attributes": {"Component": component, "pid": pid}}


def test_a_memory_question_gets_memory_per_deployment_against_its_reservation(
        store: Store) -> None:
    """One line per deployment (the largest replica process), relative to the spec's
    memory_mb, the fullest first; series without a pid are not processes; the queue, KV and
    CPU figures are left for a saturation question."""
    from aiops.capacity import Capacity

    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    points = []
    for k in range(10):
        t = T0 - (300 - 30 * k) * NS
        points += [_rss(t, "ray::ServeReplica:aiops:echo-v1", "101", 200.0 + k),
                   _rss(t, "ray::ServeReplica:aiops:echo-v1", "102", 150.0),
                   _rss(t, "ray::ServeReplica:aiops:echo-v2", "201", 480.0),
                   _rss(t, "ray::ServeReplica:aiops:echo-v2", "", 999.0)]  # no pid
    add_points(store, points)
    a = _ask(store, "how much memory is echo using?",
             capacities=[Capacity("echo", memory_mb=512)])
    assert a.intent.kind == "saturation" and a.report is not None
    lines = [x for x in a.report.lines if x.startswith("- echo-")]
    assert lines == [
        "- echo-v2 memory (RSS, largest of 1 replica process(es)): 480 MB now of its 512 MB "
        "reservation (94%); 480-480 MB in the window",
        "- echo-v1 memory (RSS, largest of 2 replica process(es)): 209 MB now of its 512 MB "
        "reservation (41%); 150-209 MB in the window"]
    assert not any("queue depth" in x for x in a.report.lines if x.startswith("- "))


def test_ray_2_60s_memory_series_without_a_pid_are_the_deployments_memory(
        store: Store) -> None:
    """Ray 2.60 sums a node's worker processes of one name into one series with no pid
    (reporter_agent.py ``_generate_system_stats_record``: tags ip and Component only) and
    sends 0 for a name whose processes ended: that is the replica's memory (the chat replica
    used 595 MB of its 512 MB while the answer said "no replica memory"), and a 0 is no
    reading."""
    from aiops.capacity import Capacity

    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    points = []
    for k in range(10):
        t = T0 - (300 - 30 * k) * NS
        points += [
            {"time": t, "name": "ray_component_rss_mb", "type": "gauge", "value": 560.0 + 4 * k,
             "attributes": {"ip": "10.0.0.5", "Component": "ray::ServeReplica:aiops:echo-v1",
                            "SessionName": "session_2026", "Version": "2.60.0"}},
            {"time": t, "name": "ray_component_rss_mb", "type": "gauge",
             "value": 0.0 if k > 2 else 300.0,  # its replica ended at k=3: Ray's reset
             "attributes": {"ip": "10.0.0.5", "Component": "ray::ServeReplica:aiops:echo-v0",
                            "SessionName": "session_2026", "Version": "2.60.0"}}]
    add_points(store, points)
    a = _ask(store, "how much memory is echo using?",
             capacities=[Capacity("echo", memory_mb=512)])
    assert a.report is not None and not a.report.gaps
    lines = [x for x in a.report.lines if x.startswith("- echo-")]
    assert lines == [
        "- echo-v1 memory (RSS of its replica processes, summed per node by Ray, largest of 1 "
        "node(s)): 596 MB now of its 512 MB reservation (116%); 560-596 MB in the window"]


def test_requests_per_second_for_a_model_that_counts_no_tokens(store: Store) -> None:
    """"QPS of the OCR model": each request's root span per second of the window; the tokens
    are said to be absent, not a gap for the whole question."""
    _requests(store, T0 - 299 * NS, 90, 1000, 40, model="ppocr-v4")
    a = _ask(store, "ppocr QPS over the last 5 minutes")
    assert (a.intent.kind, a.intent.minutes) == ("throughput", 5)
    assert a.report is not None and a.report.gaps == []
    [row] = a.report.rows
    assert (row["model"], row["requests"], row["requests_per_s"]) == ("ppocr-v4", 90, 0.3)
    assert "0.3 requests/s" in a.text and "only generative models report tokens" in a.text


def test_which_version_takes_traffic_and_what_share_each_gets(store: Store) -> None:
    """One of the issue's misses: a canary's traffic split, as each version's share of the
    model's requests (each request's root span)."""
    _requests(store, T0 - 299 * NS, 90, 1000, 40, version="v1")
    _requests(store, T0 - 299 * NS, 30, 3000, 40, version="v2")
    a = _ask(store, "which version of echo is taking traffic and what share does each get?")
    assert (a.intent.kind, a.intent.by) == ("throughput", "version")
    assert a.report is not None
    shares = {r["version"]: (r["requests"], r["share"]) for r in a.report.rows}
    assert shares == {"v1": (90, 0.75), "v2": (30, 0.25)}
    assert "75% of echo's" in a.text and "25% of echo's" in a.text


def test_which_request_is_slowest_lists_the_slowest_traces(store: Store) -> None:
    """One of the issue's misses: "哪个请求最慢?" asked for the slowest trace, not percentiles."""
    _requests(store, T0 - 299 * NS, 20, 1000, 40)
    a = _ask(store, "哪个请求最慢\uff1f")
    assert (a.intent.kind, a.intent.order) == ("traces", "slowest")
    assert a.report is not None and a.report.rows


def test_the_queue_is_shown_against_the_specs_max_queue(store: Store) -> None:
    """Answers relative to limits where a limit exists: queue depth beside ``qos.max_queue``
    (past it the ingress answers 429)."""
    from aiops.capacity import Capacity

    _requests(store, T0 - 300 * NS, 10, 1000, 40)
    add_points(store, [{"time": T0 - (200 - 30 * k) * NS, "name": "aiops.serve.queue_depth",
                        "type": "gauge", "value": float(k),
                        "attributes": {"gen_ai.request.model": "echo"}} for k in range(5)])
    a = _ask(store, "is echo saturated?", capacities=[Capacity("echo", max_queue=16)])
    assert a.report is not None
    [line] = [x for x in a.report.lines if "queue depth" in x]
    assert line.endswith("4 now, 4 at most (its spec's max_queue: 16 per priority class; "
                         "highest 25% of it)")


# --- Capacity: would the replicas serve N x today's load --------------------------------------

ECHO_LIMITS = Capacity("echo", max_queue=16, min_replicas=1, max_replicas=2,
                       target_ongoing=1.0, max_ongoing=2, num_cpus=0.5)


def test_a_load_multiple_gets_a_verdict_by_the_autoscalers_rule(store: Store) -> None:
    # One request a second, each 0.8 s in the replica: 0.8 requests in service at once.
    _requests(store, T0 - 600 * NS, 600, 1000, 801 - 3 * 3)
    a = _ask(store, "can echo take 2x the traffic?", capacities=[ECHO_LIMITS])
    assert (a.intent.kind, a.intent.load) == ("capacity", 2.0)
    assert a.report is not None
    row = a.report.rows[0]
    assert row["peak_in_service"] == pytest.approx(0.8, abs=0.05)
    assert (row["replicas_needed"], row["fit"]) == (2, "fits")
    assert "**yes**" in a.text and "max_replicas 2" in a.text
    assert "1 of Ray's CPUs reserved" in a.text


def test_a_load_the_spec_cannot_serve_at_target_says_what_to_raise(store: Store) -> None:
    _requests(store, T0 - 600 * NS, 600, 1000, 801 - 3 * 3)
    above = _ask(store, "how many replicas would echo need for triple the load?",
                 capacities=[ECHO_LIMITS])
    assert (above.intent.kind, above.intent.load) == ("capacity", 3.0)
    assert "**only above target**" in above.text
    assert "autoscaling.max_replicas to 3" in above.text
    over = _ask(store, "echo 能扛住六倍流量吗?", capacities=[ECHO_LIMITS])
    assert (over.intent.kind, over.intent.load) == ("capacity", 6.0)
    assert "**no**" in over.text and "max_queue 16" in over.text


def test_capacity_without_a_multiple_is_the_headroom_and_without_a_spec_no_verdict(
        store: Store) -> None:
    _requests(store, T0 - 600 * NS, 600, 1000, 801 - 3 * 3)
    headroom = _ask(store, "capacity planning for echo: how much more load can it take?",
                    capacities=[ECHO_LIMITS])
    assert headroom.intent.kind == "capacity" and headroom.intent.load is None
    assert "Headroom: 2.5x" in headroom.text and "5.0x before every" in headroom.text
    unknown = _ask(store, "can echo handle double the traffic?")
    assert unknown.report is not None and any("no spec" in g for g in unknown.report.gaps)
    assert "**yes**" not in unknown.text

"""How full a model is: queue depth and requests in flight at the ingress, KV-cache use (and,
asked for, its hit rate), replicas, replica memory (RSS) and CPU run-queue delay from eBPF."""

from __future__ import annotations

import re
from typing import Any

from agents.questions.model import Ask
from agents.questions.spans import REPLICA, where
from aiops import semconv
from aiops.identity import INGRESS_SERVICE
from aiops.semconv import NOT_INGRESS_SQL

__all__ = ["MEMORY_QUESTION", "SHOWN", "saturation"]

METRIC_MODEL = (f"coalesce({semconv.MODEL}, CASE WHEN service_name NOT IN "
                f"('{INGRESS_SERVICE}', 'aiops-ebpf', 'ray') THEN service_name END)")
# name, what it is, how to show a value; gauges: the latest and the highest in the window.
GAUGES = [
    ("aiops.serve.queue_depth", "queue depth (requests waiting at the ingress)", "{:g}"),
    ("aiops.serve.in_flight", "requests in flight", "{:g}"),
    ("aiops.model.kv_cache.usage", "KV-cache / context use", "{:.0%}"),
    ("vllm:kv_cache_usage_perc", "vLLM KV-cache use", "{:.0%}"),
    ("vllm:num_requests_waiting", "vLLM requests waiting", "{:g}"),
    ("aiops.serve.replicas", "replicas", "{:g}"),
]
_GPU = re.compile(r"(?<![a-z])gpus?(?![a-z])|显存|vram", re.I)
MEMORY_QUESTION = re.compile(r"memory|(?<![a-z])(?:ram|rss|oom)(?![a-z])|内存", re.I)
_HIT_RATE = re.compile(r"hit[- ]?(?:rate|ratio)|cache hits?|命中", re.I)
# Prefix-cache counters (cumulative): the Serve-hosted vLLM's (serve/backends/vllm_engine.py)
# and a scraped vLLM server's own. llama.cpp exports none.
HITS = ("vllm.prefix_cache.hits", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
SHOWN = 5  # deployments listed in a memory answer, the fullest first
QUERIES = ("vllm.prefix_cache.queries", "vllm:prefix_cache_queries_total",
           "vllm:prefix_cache_queries")


def saturation(ask: Ask) -> None:
    i = ask.intent
    if MEMORY_QUESTION.search(ask.question):
        # Asked about memory: memory is the answer; the other figures are a question away.
        ask.say(f"Replica memory over {ask.window}, the fullest first:")
        ask.report.rows = _memory(ask)
        ask.say("(Queue depth, KV cache and CPU run-queue delay: ask for the model's "
                "saturation.)")
        return
    names = [g[0] for g in GAUGES]
    clause, params = where("time", ask.since, ask.until, (METRIC_MODEL, i.model))
    # Per series (model, version, labels): its latest value and its highest; then summed over
    # series of one model and version (replicas report one series each).
    sql = f"""
        WITH series AS (
            SELECT name, {METRIC_MODEL} AS model, {semconv.VERSION} AS version,
                   arg_max(value, time) AS latest, max(value) AS highest
            FROM metric_points
            {clause}
              AND name IN ({", ".join(f"'{n}'" for n in names)}) AND value IS NOT NULL
            GROUP BY name, 2, 3, attributes)  -- by position: `model` is also a column
        SELECT name, model, version, sum(latest) AS latest, max(highest) AS highest,
               count(*) AS series
        FROM series WHERE model IS NOT NULL
        GROUP BY ALL ORDER BY model, version, name"""
    rows = ask.rows(sql, params)
    shown = {g[0]: (g[1], g[2]) for g in GAUGES}
    ask.say(f"Saturation over {ask.window} (latest, and highest in the window):")
    for r in rows:
        what, fmt = shown[r["name"]]
        where_ = r["model"] + (f"@{r['version']}" if r["version"] else "")
        limit = ""
        cap = ask.box.capacities.get(r["model"])
        if r["name"] == "aiops.serve.queue_depth" and cap is not None and cap.max_queue:
            # The spec's limit: past it, the ingress answers 429 (per priority class).
            r["max_queue"] = cap.max_queue
            limit = (f" (its spec's max_queue: {cap.max_queue} per priority class; highest "
                     f"{r['highest'] / cap.max_queue:.0%} of it)")
        ask.say(f"- {where_} {what}: {fmt.format(r['latest'])} now, "
                f"{fmt.format(r['highest'])} at most{limit}")
    if not any(r["name"] == "aiops.serve.replicas" for r in rows):
        _replicas_from_spans(ask)
    _memory(ask)
    _run_queue(ask)
    ask.report.rows = rows
    found = {r["name"] for r in rows}
    if not found & {"aiops.serve.queue_depth", "vllm:num_requests_waiting"}:
        ask.gap("no queue-depth metric in the window")
    if not found & {"aiops.model.kv_cache.usage", "vllm:kv_cache_usage_perc"}:
        ask.gap("no KV-cache metric in the window (only generative backends report one)")
    if _GPU.search(ask.question):
        ask.gap("no GPU metric in the store: the replicas here run on CPU")
    if _HIT_RATE.search(ask.question):
        _hit_rate(ask)


def _hit_rate(ask: Ask) -> None:
    """The KV (prefix) cache hit rate: hits over queries in the window, from the engine's
    counters; said to be unmeasured where no engine exports them (KV-cache *use* is not it)."""
    clause, params = where("time", ask.since, ask.until, (METRIC_MODEL, ask.intent.model))
    names = ", ".join(f"'{n}'" for n in (*HITS, *QUERIES))
    hits = ", ".join(f"'{n}'" for n in HITS)
    sql = f"""
        WITH series AS (
            SELECT {METRIC_MODEL} AS model, {semconv.VERSION} AS version,
                   name IN ({hits}) AS is_hits, max(value) - min(value) AS delta
            FROM metric_points
            {clause}
              AND name IN ({names}) AND value IS NOT NULL
            GROUP BY 1, 2, name, attributes)  -- by position: `model` is also a column
        SELECT model, version, sum(delta) FILTER (WHERE is_hits) AS hits,
               sum(delta) FILTER (WHERE NOT is_hits) AS queries
        FROM series WHERE model IS NOT NULL
        GROUP BY ALL ORDER BY ALL"""
    rows = ask.rows(sql, params)
    who = ask.intent.model or "any model"
    if not rows:
        ask.gap(f"KV-cache hit rate: not measured for {who} in {ask.window} (no prefix-cache "
                "counters: vLLM exports prefix-cache hits and queries, llama.cpp none; the "
                "KV-cache use above is how full the cache is, not how often it hits)")
        return
    for r in rows:
        where_ = r["model"] + (f"@{r['version']}" if r["version"] else "")
        if not r["queries"]:
            ask.say(f"- {where_} KV-cache hit rate: no prefix-cache lookups in the window")
        else:
            ask.say(f"- {where_} KV-cache hit rate: {r['hits'] / r['queries']:.1%} "
                    f"({r['hits']:g} of {r['queries']:g} prefix tokens looked up)")


def _replicas_from_spans(ask: Ask) -> None:
    i = ask.intent
    clause, params = where("start_time", ask.since, ask.until, ("service_name", i.model))
    sql = f"""
        SELECT service_name AS model, count(DISTINCT {REPLICA}) AS replicas
        FROM spans
        {clause}
          AND {NOT_INGRESS_SQL} AND {REPLICA} IS NOT NULL
        GROUP BY ALL ORDER BY ALL"""
    for r in ask.rows(sql, params):
        ask.say(f"- {r['model']}: {r['replicas']} replica(s) answered requests in the window")


def _memory(ask: Ask) -> list[dict[str, Any]]:
    """Replica memory per deployment (model-version), against its spec's reservation: the
    fullest first, a few of them, the rest counted (an answer, not every process's row)."""
    i = ask.intent
    clause, params = where("time", ask.since, ask.until)
    model = ""
    if i.model is not None:
        model = f"AND {semconv.DEPLOYMENT} LIKE ? || '-%'"
        params.append(i.model)
    # Ray's own RSS series; the component names the replica's deployment (model-version).
    # Older Rays label each worker process (pid); Ray 2.60 sums a node's processes of one
    # name into one series without a pid (and sends 0 once they are gone). Per-process
    # series are used where a deployment has them (a pid-less series beside them is an
    # aggregate), else one series per node; a component that names no deployment is not a
    # replica, and a 0 is a process that ended, not a reading.
    sql = f"""
        WITH pts AS (
            SELECT {semconv.DEPLOYMENT} AS deployment,
                   nullif(attributes->>'pid', '') AS pid,
                   coalesce(attributes->>'ip', attributes->>'NodeAddress',
                            resource_attributes->>'service.instance.id', '') AS node,
                   value, time
            FROM metric_points
            {clause}
              AND name = 'ray_component_rss_mb'
              AND {semconv.DEPLOYMENT} IS NOT NULL
              {model}),
        per AS (
            SELECT *, bool_or(pid IS NOT NULL) OVER (PARTITION BY deployment) AS has_pid
            FROM pts),
        proc AS (
            SELECT deployment, coalesce(pid, 'node ' || node) AS unit,
                   bool_or(pid IS NULL) AS summed, arg_max(value, time) AS latest_mb,
                   max(value) AS highest_mb, min(value) FILTER (WHERE value > 0) AS lowest_mb
            FROM per WHERE pid IS NOT NULL OR NOT has_pid
            GROUP BY ALL)
        SELECT deployment, count(*) FILTER (WHERE latest_mb > 0) AS processes,
               bool_or(summed) AS summed, max(latest_mb) AS largest_mb,
               min(lowest_mb) AS lowest_mb, max(highest_mb) AS highest_mb
        FROM proc WHERE deployment <> ''
        GROUP BY ALL HAVING max(latest_mb) > 0 ORDER BY largest_mb DESC"""
    rows = ask.rows(sql, params)
    if not rows:
        ask.gap("no replica memory (Ray's ray_component_rss_mb) in the window")
        return rows
    for r in rows:
        cap = _capacity(ask, r["deployment"])
        r["memory_mb"] = cap
        r["share"] = round(r["largest_mb"] / cap, 3) if cap else None
    rows.sort(key=lambda r: (r["share"] is None, -(r["share"] or 0), -r["largest_mb"]))
    for r in rows[:SHOWN]:
        limit = (f" of its {r['memory_mb']} MB reservation ({r['share']:.0%})"
                 if r["memory_mb"] else " (no memory reservation in its spec)")
        whose = (f"RSS of its replica processes, summed per node by Ray, largest of "
                 f"{r['processes']} node(s)" if r["summed"] else
                 f"RSS, largest of {r['processes']} replica process(es)")
        ask.say(f"- {r['deployment']} memory ({whose}): {r['largest_mb']:.0f} MB now{limit}; "
                f"{r['lowest_mb']:.0f}-{r['highest_mb']:.0f} MB in the window")
    if len(rows) > SHOWN:
        ask.say(f"- ... {len(rows) - SHOWN} more deployment(s), less full")
    ask.report.totals["memory_deployments"] = len(rows)
    return rows


def _capacity(ask: Ask, deployment: str) -> int | None:
    """The memory reservation of the model a deployment (``<model>-<version>``) serves."""
    fits = [c for name, c in ask.box.capacities.items() if deployment.startswith(f"{name}-")]
    best = max(fits, key=lambda c: len(c.model), default=None)
    return best.memory_mb if best is not None else None


def _run_queue(ask: Ask) -> None:
    i = ask.intent
    clause, params = where("time", ask.since, ask.until,
                           (semconv.MODEL, i.model))
    # eBPF run-queue delay (delta histograms, seconds): how long the replica's runnable threads
    # waited for a CPU - its CPU saturation.
    sql = f"""
        SELECT {semconv.MODEL} AS model, {semconv.VERSION} AS version,
               {semconv.REPLICA} AS replica,
               round(sum(sum) / nullif(sum(count), 0) * 1e3, 3) AS mean_ms,
               sum(count) AS waits
        FROM metric_points
        {clause}
          AND name = 'aiops.ebpf.runq.latency' AND {semconv.MODEL} IS NOT NULL
        GROUP BY ALL ORDER BY ALL"""
    rows = ask.rows(sql, params)
    if not rows:
        ask.gap("no eBPF run-queue delay for the replicas in the window (the eBPF collector "
                "runs as root only)")
    for r in rows:
        ask.say(f"- {r['model']}@{r['version']} replica {r['replica']} CPU run-queue delay: "
                f"{r['mean_ms']:g} ms mean over {r['waits']} waits")

"""Serving overview and canary comparison.

Rates, means, queues and replicas come from Prometheus (the OTLP serving metrics the server
re-exposes on ``/metrics/otlp``, and Ray's own). Latency percentiles come from the ingress
spans in DuckDB instead: the replicas' OTel histograms use the SDK's default buckets
(0, 5, 10, 25 ... seconds), far too coarse for a quantile of sub-second requests, while a
span's duration gives the exact percentile.
"""

from __future__ import annotations

from aiops import semconv
from dashboards.infinity import Column, Infinity
from dashboards.panels import (
    RATE,
    Board,
    prom,
    prom_variable,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from dashboards.sql import INGRESS_SPANS, MODEL, RANGE, VERSION, bucket, in_range

__all__ = ["canary", "overview"]

BY = "gen_ai_request_model, aiops_model_version"
LEGEND = "{{gen_ai_request_model}} {{aiops_model_version}}"
SEL = 'gen_ai_request_model=~"$model"'


def _ratio(num: str, den: str) -> str:
    """num/den per model and version, 0 (not absent) when nothing matched ``num``."""
    return f"(sum by ({BY}) ({num}) or sum by ({BY}) ({den}) * 0) / sum by ({BY}) ({den})"


def _mean(metric: str, sel: str) -> str:
    return (f"sum by ({BY}) (rate({metric}_sum{{{sel}}}[{RATE}])) / "
            f"sum by ({BY}) (rate({metric}_count{{{sel}}}[{RATE}]))")


def latency_percentiles(model_filter: bool) -> Infinity:
    where = f"AND {MODEL} = ?" if model_filter else f"AND {MODEL} IS NOT NULL"
    return Infinity.sql(
        f"""{RANGE}
        SELECT {bucket('start_time')} AS time, {MODEL} AS model, {VERSION} AS version,
               quantile_cont(duration_ns, 0.50) / 1e9 AS p50,
               quantile_cont(duration_ns, 0.95) / 1e9 AS p95,
               quantile_cont(duration_ns, 0.99) / 1e9 AS p99
        FROM spans, r WHERE {INGRESS_SPANS} AND {in_range('start_time')} {where}
        GROUP BY ALL ORDER BY time""",
        [Column("time", "timestamp_epoch"), Column("model"), Column("version"),
         Column("p50", "number"), Column("p95", "number"), Column("p99", "number")],
        ["$model"] if model_filter else None).timeseries()


PRIORITY = f"(attributes->>'{semconv.PRIORITY_ATTR}')"


def latency_by_priority() -> Infinity:
    """p50/p99 of ingress requests per priority class (the ingress names the class on its
    span), every model: is realtime work kept fast while batch work floods?"""
    return Infinity.sql(
        f"""{RANGE}
        SELECT {bucket('start_time')} AS time, {PRIORITY} AS priority,
               quantile_cont(duration_ns, 0.50) / 1e9 AS p50,
               quantile_cont(duration_ns, 0.99) / 1e9 AS p99
        FROM spans, r WHERE {INGRESS_SPANS} AND {in_range('start_time')}
          AND {PRIORITY} IS NOT NULL AND {MODEL} = ?
        GROUP BY ALL ORDER BY time""",
        [Column("time", "timestamp_epoch"), Column("priority"), Column("p50", "number"),
         Column("p99", "number")], ["$model"]).timeseries()


def overview() -> Board:
    b = Board("aiops-serving", "aiops / Serving overview",
              "Request rate, errors, latency, TTFT/TPOT, tokens/s, queues and replicas per "
              "model and version.", tags=["serving"])
    b.variables.append(prom_variable(
        "model", "model", "label_values(aiops_serve_requests_total, gen_ai_request_model)"))
    req = f"rate(aiops_serve_requests_total{{{SEL}}}[{RATE}])"
    b.row("Traffic and errors").add(
        timeseries_panel("Requests per second", "Ingress responses per model version.",
                         "reqps", prom(f"sum by ({BY}) ({req})", LEGEND)),
        timeseries_panel(
            "Error ratio (5xx)", "Share of ingress responses with a 5xx status.",
            "percentunit",
            prom(_ratio(f'rate(aiops_serve_requests_total{{{SEL},'
                        f'http_response_status_code=~"5.."}}[{RATE}])', req), LEGEND)),
        timeseries_panel(
            "Responses by status", "All ingress responses (including unknown models) by "
            "HTTP status and route.", "reqps",
            prom(f"sum by (http_response_status_code, http_route) "
                 f"(rate(aiops_serve_requests_total[{RATE}]))",
                 "{{http_response_status_code}} {{http_route}}"), stacked=True),
        timeseries_panel(
            "Model outcomes", "Requests per model replica outcome (ok / error).", "reqps",
            prom(f"sum by ({BY}, outcome) (rate(aiops_model_requests_total{{{SEL}}}[{RATE}]))",
                 f"{LEGEND} {{{{outcome}}}}"), stacked=True),
    )
    b.row("Latency").add(
        timeseries_panel("Ingress latency p50 / p95 / p99",
                         "Exact percentiles of ingress SERVER span durations (DuckDB).", "s",
                         latency_percentiles(model_filter=False)),
        timeseries_panel("Mean model latency", "Time the model replica spent per request.",
                         "s", prom(_mean("gen_ai_server_request_duration_seconds", SEL),
                                   LEGEND)),
        timeseries_panel("Time to first token (mean)", "Streaming requests.", "s",
                         prom(_mean("gen_ai_server_time_to_first_token_seconds", SEL),
                              LEGEND)),
        timeseries_panel("Time per output token (mean)", "Streaming requests, after the "
                         "first token.", "s",
                         prom(_mean("gen_ai_server_time_per_output_token_seconds", SEL),
                              LEGEND)),
    )
    b.row("Priority classes").add(
        timeseries_panel(
            "Latency by priority class (p50 / p99)", "Exact percentiles of ingress span "
            "durations per class, for the model chosen (the realtime goal: p99 <= 120 ms "
            "while batch floods; docs/benchmarks.md, Priority under load).", "s",
            latency_by_priority()),
        timeseries_panel(
            "Shed by priority class", "429s per second per class: a full class queue, or "
            "load shed by the controller. Realtime should be shed last.", "reqps",
            prom(f"sum by ({BY}, aiops_priority) (rate(aiops_serve_requests_total{{{SEL},"
                 f'http_response_status_code="429"}}[{RATE}])) or sum by ({BY}, '
                 f"aiops_priority) (rate(aiops_serve_requests_total{{{SEL},"
                 f'aiops_priority!=""}}[{RATE}])) * 0',
                 f"{LEGEND} {{{{aiops_priority}}}}"), stacked=True),
    )
    b.row("Throughput and capacity").add(
        timeseries_panel(
            "Tokens per second", "Input and output tokens per second.", "short",
            prom(f"sum by ({BY}, gen_ai_token_type) "
                 f"(rate(gen_ai_client_token_usage_sum{{{SEL}}}[{RATE}]))",
                 f"{LEGEND} {{{{gen_ai_token_type}}}}")),
        timeseries_panel(
            "Queue depth", "Requests waiting at the ingress, by priority class.", "short",
            prom(f"sum by ({BY}, aiops_priority) (aiops_serve_queue_depth{{{SEL}}})",
                 f"{LEGEND} {{{{aiops_priority}}}}"),
            prom(f"sum by ({BY}) (aiops_serve_in_flight{{{SEL}}})", f"{LEGEND} in flight")),
        timeseries_panel(
            "Replicas", "Running replicas per model version (Serve driver) and healthy "
            "replicas per deployment (Ray).", "short",
            prom(f"sum by ({BY}) (aiops_serve_replicas{{{SEL}}})", LEGEND),
            prom("sum by (deployment) (ray_serve_deployment_replica_healthy)",
                 "{{deployment}} healthy (Ray)")),
        timeseries_panel(
            "KV cache / context in use", "Share of the backend's KV cache or context in use "
            "after a request (LLMs).", "percentunit",
            prom(f"max by ({BY}) (aiops_model_kv_cache_usage_ratio{{{SEL}}})", LEGEND)),
    )
    return b


def canary() -> Board:
    b = Board("aiops-canary", "aiops / Canary comparison",
              "The versions of one model side by side: traffic share, errors, latency, "
              "TTFT/TPOT.", tags=["serving", "canary"])
    b.variables.append(prom_variable(
        "model", "model", "label_values(aiops_serve_requests_total, gen_ai_request_model)",
        include_all=False))
    sel = 'gen_ai_request_model="$model"'
    legend = "{{aiops_model_version}}"
    req = f"rate(aiops_serve_requests_total{{{sel}}}[{RATE}])"
    b.row("Traffic").add(
        stat_panel("Configured traffic weight", "Share of the model's traffic each version "
                   "is configured to get.", "percent",
                   prom(f"max by (aiops_model_version) "
                        f"(aiops_serve_traffic_weight_percent{{{sel}}})", legend), width=8),
        timeseries_panel("Observed traffic share", "Share of the model's responses each "
                         "version served.", "percentunit",
                         prom(f"sum by (aiops_model_version) ({req}) / ignoring "
                              f"(aiops_model_version) group_left sum ({req})", legend),
                         width=16),
    )
    b.row("Errors and latency per version").add(
        timeseries_panel("Error ratio (5xx)", "Per version.", "percentunit",
                         prom(_ratio(f'rate(aiops_serve_requests_total{{{sel},'
                                     f'http_response_status_code=~"5.."}}[{RATE}])', req),
                              legend)),
        timeseries_panel("Ingress latency p50 / p95 / p99", "Exact, from ingress spans.", "s",
                         latency_percentiles(model_filter=True)),
        timeseries_panel("Time to first token (mean)", "Streaming requests.", "s",
                         prom(_mean("gen_ai_server_time_to_first_token_seconds", sel), legend)),
        timeseries_panel("Time per output token (mean)", "Streaming requests.", "s",
                         prom(_mean("gen_ai_server_time_per_output_token_seconds", sel),
                              legend)),
    )
    b.row("Summary over the range").add(table_panel(
        "Versions over the dashboard range", "Requests, 5xx share and exact latency "
        "percentiles per version (ingress spans).",
        Infinity.sql(
            f"""{RANGE}
            SELECT {VERSION} AS version, count(*) AS requests,
                   count(*) FILTER (WHERE {semconv.FAILED}) / count(*) AS error_ratio,
                   quantile_cont(duration_ns, 0.50) / 1e9 AS p50_s,
                   quantile_cont(duration_ns, 0.95) / 1e9 AS p95_s,
                   quantile_cont(duration_ns, 0.99) / 1e9 AS p99_s
            FROM spans, r WHERE {INGRESS_SPANS} AND {in_range('start_time')} AND {MODEL} = ?
            GROUP BY ALL ORDER BY version""",
            [Column("version"), Column("requests", "number"), Column("error_ratio", "number"),
             Column("p50_s", "number"), Column("p95_s", "number"), Column("p99_s", "number")],
            ["$model"]), height=6))
    return b

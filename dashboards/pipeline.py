"""Telemetry pipeline health: the aiops server's own metrics (OTLP ingest, group commit, memory
budget, SQL API), Prometheus' view of its targets, and how fresh each sender's data is."""

from __future__ import annotations

from dashboards.infinity import Column, Infinity
from dashboards.panels import RATE, Board, prom, stat_panel, table_panel, timeseries_panel
from dashboards.sql import RANGE, epoch_ms, in_range

__all__ = ["pipeline"]


def pipeline() -> Board:
    b = Board("aiops-pipeline", "aiops / Telemetry pipeline health",
              "OTLP ingest into DuckDB, its backpressure and latency, scrape targets and data "
              "freshness per sender.", tags=["pipeline"])
    b.row("Targets").add(
        stat_panel("Targets up", "Prometheus scrape targets answering (1) or not (0).", "none",
                   prom("up", "{{job}}"), width=12),
        timeseries_panel("Scrape duration", "Seconds Prometheus spent per scrape; "
                         "/metrics/otlp reads DuckDB.", "s",
                         prom("scrape_duration_seconds", "{{job}}"), width=12),
    )
    b.row("OTLP ingest").add(
        timeseries_panel("OTLP requests per second", "By signal and HTTP status (503: over "
                         "the memory budget, 413: too large, 400: malformed).", "reqps",
                         prom(f"sum by (signal, code) (rate(aiops_otlp_requests_total[{RATE}]))",
                              "{{signal}} {{code}}"), stacked=True),
        timeseries_panel("Rows committed per second", "Rows appended to DuckDB, by table.",
                         "short", prom(f"sum by (table) (rate(aiops_otlp_rows_total[{RATE}]))",
                                       "{{table}}"), stacked=True),
        timeseries_panel("OTLP request latency p99", "Decode + group commit per request.",
                         "s", prom(f"histogram_quantile(0.99, sum by (le, signal) "
                                   f"(rate(aiops_otlp_request_seconds_bucket[{RATE}])))",
                                   "{{signal}}")),
        timeseries_panel("Records rejected per second", "Records left out of accepted "
                         "requests (partial success).", "short",
                         prom(f"sum(rate(aiops_otlp_rejected_records_total[{RATE}])) "
                              "or vector(0)", "rejected")),
    )
    b.row("Store").add(
        timeseries_panel("Ingest memory in flight", "Bytes of bodies and decoded batches "
                         "held; requests beyond the budget get 503.", "bytes",
                         prom("aiops_ingest_buffer_bytes", "in flight"),
                         prom("aiops_ingest_buffer_peak_bytes", "peak")),
        timeseries_panel("Group commits per second", "DuckDB transactions of the committer.",
                         "short", prom(f"rate(aiops_ingest_group_commits[{RATE}])", "commits")),
        timeseries_panel("SQL API queries per second", "By outcome (ok, rejected, failed).",
                         "short", prom(f"sum by (outcome) (rate(aiops_sql_queries_total[{RATE}]))",
                                       "{{outcome}}")),
        table_panel("Data freshness", "Last point or span per sender in the range, and its "
                    "age at the end of the range.", Infinity.sql(
                        f"""{RANGE}, last AS (
                          SELECT 'metrics' AS signal, service_name, max(time) AS t
                          FROM metric_points, r WHERE {in_range('time')} GROUP BY ALL
                          UNION ALL
                          SELECT 'spans', service_name, max(start_time)
                          FROM spans, r WHERE {in_range('start_time')} GROUP BY ALL
                          UNION ALL
                          SELECT 'logs', service_name, max(time)
                          FROM logs, r WHERE {in_range('time')} GROUP BY ALL)
                        SELECT signal, service_name, {epoch_ms('t')} AS last_seen,
                               (epoch_ms(r.t1) - {epoch_ms('t')}) / 1000 AS age_s
                        FROM last, r ORDER BY signal, service_name""",
                        [Column("signal"), Column("service_name"),
                         Column("last_seen", "timestamp_epoch"), Column("age_s", "number")]),
                    width=12),
    )
    return b

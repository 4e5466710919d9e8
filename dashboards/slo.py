"""SLO burn per model version, computed the way the analyzer's detector computes it
(``aiops.analytics.slo``): from ingress SERVER spans, a latency objective as the share of
requests slower than the model's ``p95_ms`` (budget 5%) or ``p99_ms`` (1%), an error objective
as the share of 5xx answers over ``error_rate``; burn = bad share / budget.

The objectives come from the model specs when the dashboards are generated
(``serve.specs.objectives_from_specs``, the same reading of ``qos.slo`` the server hands the
analyzer); a deployment with other specs regenerates them with
``aiops dashboards generate --models FILE``.
"""

from __future__ import annotations

from aiops import semconv
from aiops.config import Settings
from aiops.slo_spec import BurnWindow, Objective, parse_windows
from dashboards.infinity import Column, Infinity
from dashboards.panels import Board, table_panel, timeseries_panel
from dashboards.sql import INGRESS_SPANS, MODEL, RANGE, VERSION, bucket, in_range
from serve.specs import objectives_from_specs

__all__ = ["default_windows", "slo"]

# The objective's columns: one value per model, grouped by so that expressions may use them.
_OBJECTIVE = "o.latency_ms, o.latency_budget, o.error_budget"


def default_windows() -> list[BurnWindow]:
    """The analyzer's default window pairs (``AIOPS_ANALYTICS_BURN_WINDOWS``)."""
    return parse_windows(str(Settings.model_fields["analytics_burn_windows"].default))


def _sql_number(x: float | None) -> str:
    return "NULL" if x is None else repr(float(x))


def _objectives_cte(objectives: tuple[Objective, ...]) -> str:
    rows = ", ".join(
        f"('{o.model}', {_sql_number(o.latency_ms)}, {_sql_number(o.latency_budget)}, "
        f"{_sql_number(o.error_budget)})" for o in objectives)
    # A typed empty relation when no model states an objective, so the SQL stays valid.
    values = rows or "(NULL, NULL, NULL, NULL)"
    return (f"o(model, latency_ms, latency_budget, error_budget) AS "
            f"(SELECT * FROM (VALUES {values}) WHERE #1 IS NOT NULL)")


def _spans() -> str:
    return (f"s AS (SELECT start_time, {MODEL} AS model, {VERSION} AS version, duration_ns, "
            f"{semconv.FAILED} AS failed FROM spans, r "
            f"WHERE {INGRESS_SPANS} AND {in_range('start_time')})")


def _burn_over_time(objectives: tuple[Objective, ...]) -> Infinity:
    return Infinity.sql(
        f"""{RANGE}, {_objectives_cte(objectives)}, {_spans()}
        SELECT {bucket('s.start_time')} AS time, s.model, s.version,
               count(*) FILTER (WHERE s.duration_ns > o.latency_ms * 1e6)
                 / count(*) / o.latency_budget AS latency_burn,
               count(*) FILTER (WHERE s.failed) / count(*) / o.error_budget AS error_burn
        FROM s JOIN o USING (model), r
        GROUP BY time, s.model, s.version, {_OBJECTIVE} ORDER BY time""",
        [Column("time", "timestamp_epoch"), Column("model"), Column("version"),
         Column("latency_burn", "number"), Column("error_burn", "number")]).timeseries()


def _burn_now(objectives: tuple[Objective, ...], windows: list[BurnWindow]) -> Infinity:
    pairs = ", ".join(f"({w.long_s:g}, {w.short_s:g}, {w.threshold:g})" for w in windows)
    long_w = "s.start_time >= r.t1 - to_seconds(w.long_s::BIGINT)"
    short_w = "s.start_time >= r.t1 - to_seconds(w.short_s::BIGINT)"
    slow = "s.duration_ns > o.latency_ms * 1e6"
    return Infinity.sql(
        f"""{RANGE}, {_objectives_cte(objectives)}, {_spans()},
        w(long_s, short_s, threshold) AS (VALUES {pairs}),
        c AS (
          SELECT s.model, s.version, w.long_s, w.short_s, w.threshold,
                 o.latency_budget AS lb, o.error_budget AS eb,
                 count(*) FILTER (WHERE {long_w}) AS n_long,
                 count(*) FILTER (WHERE {short_w}) AS n_short,
                 count(*) FILTER (WHERE {long_w} AND {slow}) AS slow_long,
                 count(*) FILTER (WHERE {short_w} AND {slow}) AS slow_short,
                 count(*) FILTER (WHERE {long_w} AND s.failed) AS err_long,
                 count(*) FILTER (WHERE {short_w} AND s.failed) AS err_short
          FROM s JOIN o USING (model), w, r
          GROUP BY s.model, s.version, w.long_s, w.short_s, w.threshold, {_OBJECTIVE})
        SELECT model, version, long_s::INTEGER || 's/' || short_s::INTEGER || 's' AS windows,
               threshold, n_long AS requests,
               slow_long / nullif(n_long, 0) / lb AS latency_burn_long,
               slow_short / nullif(n_short, 0) / lb AS latency_burn_short,
               err_long / nullif(n_long, 0) / eb AS error_burn_long,
               err_short / nullif(n_short, 0) / eb AS error_burn_short
        FROM c ORDER BY model, version, long_s""",
        [Column("model"), Column("version"), Column("windows"), Column("threshold", "number"),
         Column("requests", "number"), Column("latency_burn_long", "number"),
         Column("latency_burn_short", "number"), Column("error_burn_long", "number"),
         Column("error_burn_short", "number")])


def _budget_left(objectives: tuple[Objective, ...]) -> Infinity:
    return Infinity.sql(
        f"""{RANGE}, {_objectives_cte(objectives)}, {_spans()}
        SELECT s.model, s.version, count(*) AS requests,
               1 - count(*) FILTER (WHERE s.duration_ns > o.latency_ms * 1e6)
                   / count(*) / o.latency_budget AS latency_budget_left,
               1 - count(*) FILTER (WHERE s.failed)
                   / count(*) / o.error_budget AS error_budget_left
        FROM s JOIN o USING (model)
        GROUP BY s.model, s.version, {_OBJECTIVE} ORDER BY s.model, s.version""",
        [Column("model"), Column("version"), Column("requests", "number"),
         Column("latency_budget_left", "number"), Column("error_budget_left", "number")])


def slo(objectives: tuple[Objective, ...] | None = None,
        windows: list[BurnWindow] | None = None) -> Board:
    objectives = objectives_from_specs(None) if objectives is None else objectives
    windows = windows or default_windows()
    listed = ", ".join(
        f"{o.model} ({'latency ' + format(o.latency_ms, 'g') + ' ms' if o.latency_ms else ''}"
        f"{', ' if o.latency_ms and o.error_budget else ''}"
        f"{'errors ' + format(o.error_budget, 'g') if o.error_budget else ''})"
        for o in objectives) or "none"
    b = Board("aiops-slo", "aiops / SLO burn",
              f"Error-budget burn per model version. Objectives: {listed}.", tags=["slo"])
    b.row("Burn").add(
        timeseries_panel("Burn rate over time", "Bad share / budget per bucket; 1 spends the "
                         "budget exactly over the SLO period.", "short",
                         _burn_over_time(objectives), width=24),
        table_panel("Burn per window pair, at the end of the range", "A pair fires when both "
                    "its long and short window burn faster than its threshold (the analyzer's "
                    "rule).", _burn_now(objectives, windows), width=14),
        table_panel("Error budget left over the range", "1 - burn over the whole dashboard "
                    "range.", _budget_left(objectives), width=10),
    )
    return b

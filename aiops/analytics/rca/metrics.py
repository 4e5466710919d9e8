"""Metric evidence (BARO-style): the level a series held in the anomaly window against its
baseline median, in baseline IQRs; the metric's name gives the fault class. Where the scope
has peers (the same system's other incidents), the move counts only beyond the level the
series typically holds in them (the median of their levels)."""

from __future__ import annotations

import re

from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig
from aiops.analytics.rca.scope import Db, Scope

_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cpu", re.compile(r"cpu|throttl")),
    ("memory", re.compile(r"mem|rss|heap|oom")),
    ("errors", re.compile(r"error|fail|exception|5xx|success|availab|uptime")),
    ("latency", re.compile(
        r"latenc|duration|(^|_)lat(_|$)|response_time|wait|queue|ongoing|pending|in_?flight")),
    ("network", re.compile(r"net|receive|transmit|bytes_(sent|recv)|packet|tcp|(^|_)[rt]x_")),
    ("traffic", re.compile(r"workload|(^|_)lod$|qps|throughput|requests|(^|\W)ops(\W|$)")),
)

# Shares bounded at 100% (or 1): compared as the share that failed (metric_evidence).
_BOUNDED_SHARE = r"availab|uptime"

_CLASS_OF_FAMILY = {"cpu": FaultClass.CPU, "memory": FaultClass.MEMORY,
                    "errors": FaultClass.ERRORS, "latency": FaultClass.LATENCY,
                    "network": FaultClass.NETWORK, "other": FaultClass.LATENCY}


def metric_family(name: str) -> str:
    """cpu, memory, errors, latency, network, traffic or other, from a metric's name."""
    low = name.lower()
    for family, pattern in _FAMILIES:
        if pattern.search(low):
            return family
    return "other"


def metric_evidence(db: Db, scope: Scope, cfg: RankConfig) -> list[Evidence]:
    # Cumulative counters become per-second rates and histograms per-interval means; gauges
    # are taken as they are. The spread is the IQR, or a quarter of the 5-95% range when
    # that is wider: quantised series (percentiles from histogram buckets) sit on one value
    # with regular excursions, and such an excursion is not an anomaly.
    sql = f"""
        WITH pts AS (
            SELECT {scope.entity} AS ent, name, coalesce(attributes, '') AS labels, time,
                   type, coalesce(temporality, 'cumulative') AS temporality,
                   coalesce(is_monotonic, false) AS mono, value, sum, count
            FROM metric_points WHERE {scope.bounds('time')}
        ), series AS (
            SELECT ent, name, labels, time, CASE
                WHEN type IN ('histogram', 'exponential_histogram', 'summary') THEN
                    CASE WHEN temporality = 'delta' THEN sum / nullif(count, 0)
                         ELSE (sum - lag(sum) OVER w) / nullif(count - lag(count) OVER w, 0)
                    END
                WHEN type = 'sum' AND mono AND temporality = 'cumulative' THEN
                    (value - lag(value) OVER w)
                    / nullif(epoch(time) - epoch(lag(time) OVER w), 0)
                ELSE value END AS v
            FROM pts WHERE ent IS NOT NULL
            WINDOW w AS (PARTITION BY ent, name, labels ORDER BY time)
        ), ph AS (
            -- A share bounded above (availability, uptime, in percent or as a fraction) is
            -- read as its complement, the share that failed: its spread's floor is then
            -- relative to the failures, not to the 100% it sits at.
            SELECT * REPLACE (CASE WHEN regexp_matches(lower(name), '{_BOUNDED_SHARE}')
                              THEN (CASE WHEN max(v) OVER s > 1 THEN 100 ELSE 1 END) - v
                              ELSE v END AS v),
                   {scope.phase('time')} AS phase, {scope.peer('time')} AS peer FROM series
            WHERE v IS NOT NULL AND isfinite(v)
            WINDOW s AS (PARTITION BY ent, name, labels)
        ), b AS (
            SELECT ent, name, labels, median(v) AS med,
                   greatest(quantile_cont(v, 0.75) - quantile_cont(v, 0.25),
                            (quantile_cont(v, 0.95) - quantile_cont(v, 0.05)) / 4,
                            {cfg.rel_floor} * abs(median(v)), {cfg.eps}) AS spread
            FROM ph WHERE phase = 0 GROUP BY ALL HAVING count(*) >= {cfg.min_points}
        ), a AS (
            SELECT ent, name, labels, quantile_cont(v, {1 - cfg.anomaly_q}) AS hi,
                   quantile_cont(v, {cfg.anomaly_q}) AS lo
            FROM ph WHERE phase = 1 GROUP BY ALL
        ), pl AS (
            -- Each peer incident's level, as the anomaly's is taken.
            SELECT ent, name, labels, peer, quantile_cont(v, {1 - cfg.anomaly_q}) AS hi,
                   quantile_cont(v, {cfg.anomaly_q}) AS lo
            FROM ph WHERE peer IS NOT NULL GROUP BY ALL
        ), p AS (
            -- The level this series typically holds in the system's incidents: a move that
            -- every incident brings (load, a shared dependency) is not this one's cause.
            SELECT ent, name, labels, median(hi) AS p_hi, median(lo) AS p_lo
            FROM pl GROUP BY ALL HAVING count(*) >= {cfg.min_peers}
        ), d AS (
            SELECT a.ent, a.name, a.labels, med, hi, lo, spread,
                   hi - greatest(med, coalesce(p_hi, med)) AS up,
                   least(med, coalesce(p_lo, med)) - lo AS down
            FROM a JOIN b USING (ent, name, labels) LEFT JOIN p USING (ent, name, labels)
        )
        SELECT ent, name, labels, med, CASE WHEN up >= down THEN hi ELSE lo END AS level,
               greatest(up, down) / spread AS z
        FROM d WHERE greatest(up, down) / spread >= {cfg.threshold}"""
    out = []
    for ent, name, labels, med, level, z in db.rows(sql):
        family = metric_family(str(name))
        if family == "traffic":
            continue  # load moves with the users, not with the fault
        metric_id = str(name) if labels in ("", "{}") else f"{name}{labels}"
        out.append(Evidence(EvidenceKind.METRIC, metric_id, str(ent), _CLASS_OF_FAMILY[family],
                            f"metric:{family}", float(level), float(med), float(z)))
    return out

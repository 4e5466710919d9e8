"""Evidence across signals for a suspected model version: trace -> log -> metric -> change.

From the traces its findings name, the log records of those traces (with their templates);
the version's own serving metric (request duration histogram) now against its reference (its
own past, else its sibling versions); and recent changes: when the version first served
(a deployment or a canary step shows up as a version's first span).
"""

from __future__ import annotations

from typing import Any

from aiops import semconv
from aiops.analytics.findings import Entity, EvidenceKind
from aiops.analytics.incidents import RankedCause
from aiops.analytics.logs import LogTemplates
from aiops.store import Store

__all__ = ["context_evidence"]

NS = 1_000_000_000

# Bounded in time as well (the traces are the window's; their logs are not older than the
# lookback): a random trace id prunes nothing, the time column's zone maps prune the rest.
_LOGS = """
SELECT trace_id, severity_text, body FROM logs
WHERE trace_id IN (SELECT unnest(?::VARCHAR[])) AND time > make_timestamp_ns(?)
ORDER BY time LIMIT 50
"""

_DURATION = f"""
SELECT {semconv.VERSION} = ? AS mine, epoch_ns(time) > ? AS current,
       sum(sum) / nullif(sum(count), 0) AS mean_s, sum(count) AS n
FROM metric_points
WHERE name = 'gen_ai.server.request.duration' AND time > make_timestamp_ns(?)
  AND {semconv.MODEL} = ?
GROUP BY ALL
"""

_FIRST_SEEN = f"""
SELECT {semconv.VERSION} AS version, min(epoch_ns(start_time)) AS first_ns
FROM spans WHERE service_name = ? AND start_time > make_timestamp_ns(?) GROUP BY ALL
"""


def context_evidence(store: Store, cause: RankedCause, now_ns: int, window_s: float = 20.0,
                     lookback_s: float = 1800.0, templates: LogTemplates | None = None
                     ) -> list[dict[str, Any]]:
    entity = cause.entity
    out: list[dict[str, Any]] = []
    traces = sorted({e.id for e in cause.evidence if e.kind == EvidenceKind.TRACE and e.id})
    if traces:
        miner = templates or LogTemplates()
        since = now_ns - int(lookback_s * NS)
        for trace_id, severity, body in store.query(_LOGS, [traces, since]).rows:
            match = miner.add(body or "")
            out.append({"kind": "log_template", "id": match.template, "trace_id": trace_id,
                        "severity": severity, "template_id": match.template_id})
    if entity.version is not None:
        out += _metric_delta(store, entity, now_ns, window_s, lookback_s)
        out += _changes(store, entity, now_ns, lookback_s)
    return out


def _metric_delta(store: Store, entity: Entity, now_ns: int, window_s: float,
                  lookback_s: float) -> list[dict[str, Any]]:
    cur = now_ns - int(window_s * NS)
    rows = store.query(_DURATION, [entity.version, cur, now_ns - int(lookback_s * NS),
                                   entity.service]).rows
    means = {(bool(mine), bool(current)): (float(m), int(n)) for mine, current, m, n in rows
             if m is not None}
    now = means.get((True, True))
    reference = means.get((True, False)) or means.get((False, True)) \
        or means.get((False, False))
    if now is None or reference is None:
        return []
    return [{"kind": "metric", "id": "gen_ai.server.request.duration",
             "entity": str(entity), "signal": "mean_s", "observed": now[0],
             "baseline": reference[0], "ratio": now[0] / reference[0] if reference[0] else None,
             "points": now[1]}]


def _changes(store: Store, entity: Entity, now_ns: int, lookback_s: float
             ) -> list[dict[str, Any]]:
    out = []
    since = now_ns - int(lookback_s * NS)
    for version, first_ns in store.query(_FIRST_SEEN, [entity.service, since]).rows:
        # First seen well inside the lookback: it started serving then (not just "before").
        if version == entity.version and first_ns > since + 60 * NS:
            out.append({"kind": "change", "id": f"{entity.service}@{version} first served",
                        "time_ns": int(first_ns)})
    return out

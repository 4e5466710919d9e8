"""Trace anomalies: latency and errors per operation against a baseline.

Per (service, span name, model version) the current window is compared with a baseline: the
same group's own recent history when it has enough of it, else its sibling versions (a canary
that misbehaves from its first request has no history of its own; its stable version is the
reference). Latency uses medians and the median absolute deviation, errors the failed share;
both need a minimum number of spans, so one slow request is not an anomaly.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiops.analytics.findings import SPAN_VERSION, Entity, EvidenceKind, FaultClass, Finding
from aiops.store import Store

__all__ = ["TraceThresholds", "trace_findings"]

NS = 1_000_000_000
INGRESS = "ingress"


@dataclass(frozen=True)
class TraceThresholds:
    window_s: float = 20.0
    baseline_s: float = 600.0
    min_spans: int = 5
    latency_ratio: float = 1.5  # the median must also grow by this factor
    robust_z: float = 4.0  # ...and by this many scaled MADs
    error_share: float = 0.2  # failed share that can fire at all
    error_increase: float = 0.1  # over the baseline's failed share


# Groups: ingress spans are one group per operation (the caller); model spans one per
# operation and version (the callees, where a version's own trouble shows).
_GROUPS = f"""
WITH s AS (
  SELECT service_name AS service, name,
         CASE WHEN service_name = ? THEN NULL ELSE {SPAN_VERSION} END
             AS version, attributes->>'gen_ai.request.model' AS model,
         duration_ns, status_code = 'error'
             OR TRY_CAST(attributes->>'http.response.status_code' AS INTEGER) >= 500 AS failed,
         trace_id, epoch_ns(start_time) >= ? AS current
  FROM spans
  WHERE start_time > make_timestamp_ns(?) AND start_time <= make_timestamp_ns(?)
    AND service_name IS NOT NULL AND duration_ns IS NOT NULL
)
SELECT service, name, version, model, current,
       count(*) AS n, median(duration_ns) AS med, mad(duration_ns) AS mad,
       avg(failed::INTEGER) AS failed_share,
       arg_max(trace_id, duration_ns) AS slowest,
       arg_max(trace_id, failed::INTEGER * 1e18 + duration_ns) AS failed_trace
FROM s GROUP BY ALL
"""


# (service, span name, version, model served)
_Key = tuple[str, str, str | None, str | None]


@dataclass
class _Stats:
    n: int
    med: float
    mad: float
    failed: float
    slowest: str
    failed_trace: str


def _baseline(own: _Stats | None, siblings: list[_Stats], min_spans: int) -> _Stats | None:
    if own is not None and own.n >= min_spans:
        return own
    pool = [s for s in siblings if s.n >= min_spans]
    if not pool:
        return None
    # The sibling with the most spans is the stable version in a canary rollout.
    return max(pool, key=lambda s: s.n)


def trace_findings(store: Store, now_ns: int, t: TraceThresholds | None = None
                   ) -> list[Finding]:
    t = t or TraceThresholds()
    cur_start = now_ns - int(t.window_s * NS)
    rows = store.query(_GROUPS, [INGRESS, cur_start, now_ns - int(t.baseline_s * NS),
                                 now_ns]).rows
    current: dict[_Key, _Stats] = {}
    history: dict[_Key, _Stats] = {}
    for service, name, version, model, is_current, n, med, mad, failed, slowest, ftrace in rows:
        stats = _Stats(int(n), float(med), float(mad or 0), float(failed or 0), slowest, ftrace)
        (current if is_current else history)[(service, name, version, model)] = stats
    found = []
    for key, cur in current.items():
        service, name, version, model = key
        if cur.n < t.min_spans:
            continue
        siblings = [s for (sv, nm, v, m), s in {**history, **current}.items()
                    if sv == service and nm == name and m == model and v != version]
        base = _baseline(history.get(key), siblings, t.min_spans)
        if base is None:
            continue
        entity = Entity(service, version)
        about = model if service == INGRESS else None
        scale = max(1.4826 * base.mad, 0.1 * base.med, 1e6)  # at least 1 ms
        z = (cur.med - base.med) / scale
        if cur.med > t.latency_ratio * base.med and z > t.robust_z:
            found.append(Finding(
                "trace_latency", entity, FaultClass.LATENCY, z / t.robust_z, cur_start, now_ns,
                f"{entity} '{name}': median {cur.med / 1e6:.0f} ms over {cur.n} spans vs "
                f"{base.med / 1e6:.0f} ms normally ({cur.med / base.med:.1f}x)",
                [entity.evidence(EvidenceKind.TRACE, cur.slowest, FaultClass.LATENCY,
                                 f"slowest '{name}' now", cur.med / 1e6, base.med / 1e6, z),
                 entity.evidence(EvidenceKind.TRACE, base.slowest, FaultClass.LATENCY,
                                 f"slowest '{name}' in the baseline"),
                 entity.evidence(EvidenceKind.METRIC, f"span.duration.median{{{name}}}",
                                 FaultClass.LATENCY, "median_ms", cur.med / 1e6,
                                 base.med / 1e6, z)], about))
        if cur.failed >= t.error_share and cur.failed > base.failed + t.error_increase:
            found.append(Finding(
                "trace_errors", entity, FaultClass.ERRORS,
                (cur.failed - base.failed) / t.error_increase, cur_start, now_ns,
                f"{entity} '{name}': {cur.failed:.0%} of {cur.n} spans failed vs "
                f"{base.failed:.0%} normally",
                [entity.evidence(EvidenceKind.TRACE, cur.failed_trace, FaultClass.ERRORS,
                                 f"a failed '{name}' span"),
                 entity.evidence(EvidenceKind.METRIC, f"span.failed_share{{{name}}}",
                                 FaultClass.ERRORS, "failed_share", cur.failed, base.failed,
                                 (cur.failed - base.failed) / t.error_increase)], about))
    return found

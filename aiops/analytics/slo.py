"""SLO burn rate per model version, over several window pairs (multi-window alerting).

The SLI is the user's view: the ingress SERVER span of each request (its duration, its HTTP
status). A model's spec states its objectives (``qos.slo``): ``p95_ms`` means 95% of requests
finish within that time (error budget 5%), ``p99_ms`` likewise with 1%, ``error_rate`` is the
budget of failed (5xx) requests. burn = bad fraction / budget; a window pair fires when both
its long and its short window burn faster than its threshold (the long window for
significance, the short one so that it stops firing soon after recovery).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiops import semconv
from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.slo_spec import BurnWindow, Objective, parse_windows  # the values (re-exported)
from aiops.store import Store

# The detector's name on its findings: an incident's symptom is the SLO that burns.
SLO_BURN = "slo_burn"

__all__ = ["SLO_BURN", "BurnWindow", "Objective", "burn_findings", "parse_windows"]

NS = 1_000_000_000


_SQL = f"""
SELECT {semconv.ROUTED_VERSION_SQL} AS version,
       count(*) AS total,
       count(*) FILTER (WHERE duration_ns > ?) AS slow,
       count(*) FILTER (WHERE {semconv.FAILED}) AS failed,
       arg_max(trace_id, duration_ns) AS slowest_trace,
       arg_max(trace_id, {semconv.FAILED}::INTEGER) AS failed_trace
FROM spans
WHERE {semconv.INGRESS_SQL} AND kind = 'server'
  AND {semconv.MODEL} = ?
  AND start_time > make_timestamp_ns(?) AND start_time <= make_timestamp_ns(?)
GROUP BY ALL
"""


def _counts(store: Store, o: Objective, start_ns: int, end_ns: int
            ) -> dict[str, tuple[int, int, int, str, str]]:
    threshold_ns = int((o.latency_ms or 1e12) * 1e6)
    rows = store.query(_SQL, [threshold_ns, o.model, start_ns, end_ns]).rows
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), r[4], r[5]) for r in rows if r[0]}


def burn_findings(store: Store, objectives: Iterable[Objective], windows: list[BurnWindow],
                  now_ns: int, min_requests: int = 5) -> list[Finding]:
    """One finding per (model version, objective) whose burn exceeds a window pair."""
    found: list[Finding] = []
    for o in objectives:
        for w in windows:
            long_c = _counts(store, o, now_ns - int(w.long_s * NS), now_ns)
            short_c = _counts(store, o, now_ns - int(w.short_s * NS), now_ns)
            for version, (total, slow, failed, slow_trace, failed_trace) in long_c.items():
                s_total, s_slow, s_failed, _, _ = short_c.get(version, (0, 0, 0, "", ""))
                if total < min_requests or s_total == 0:
                    continue
                checks = []
                if o.latency_ms is not None:
                    checks.append((FaultClass.LATENCY, slow, s_slow, o.latency_budget,
                                   f"slower than {o.latency_ms:g} ms", slow_trace))
                if o.error_budget:
                    checks.append((FaultClass.ERRORS, failed, s_failed, o.error_budget,
                                   "failed (5xx)", failed_trace))
                for fault, bad, s_bad, budget, what, trace in checks:
                    burn, s_burn = bad / total / budget, s_bad / s_total / budget
                    if min(burn, s_burn) <= w.threshold:
                        continue
                    entity = Entity(o.model, version)
                    found.append(Finding(
                        SLO_BURN, entity, fault,
                        # Start: the short window's, the tighter bound on when it began
                        # (the long window's can reach an hour back).
                        min(burn, s_burn) / w.threshold, now_ns - int(w.short_s * NS), now_ns,
                        f"{o.model} {version}: {bad}/{total} requests {what} in "
                        f"{w.long_s:g} s, burning the error budget {burn:.1f}x "
                        f"({s_burn:.1f}x over {w.short_s:g} s)",
                        [entity.evidence(EvidenceKind.METRIC, "slo.burn_rate", fault,
                                         f"burn:{w.long_s:g}s/{w.short_s:g}s", burn,
                                         w.threshold, burn / w.threshold),
                         entity.evidence(EvidenceKind.TRACE, trace, fault,
                                         f"a request {what}")]))
    return found

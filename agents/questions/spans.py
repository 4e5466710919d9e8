"""Which spans stand for a model's requests, as SQL the question modules share.

A request's latency as its client saw it is its root SERVER span: the ingress span of the
embedded stack (the model requested, the version it was routed to), or the root span an app
instrumented by its owner exports (its ``service.name`` and release). Replicas are only known
inside the model: its own spans carry the replica id. Model, version, replica, HTTP status and
failed are the typed span columns of ``aiops.semconv``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiops import semconv
from aiops.analytics.findings import NOT_WARMUP

__all__ = ["FAILED", "HTTP_STATUS", "MODEL", "REPLICA", "REQUEST", "VERSION", "column", "label",
           "percentile_columns", "roots", "where"]

MODEL = f"coalesce({semconv.MODEL}, CASE WHEN {semconv.NOT_INGRESS_SQL} THEN service_name END)"
# On the ingress, the version a request was routed to (the ingress's own release is no model's).
VERSION = (f"CASE WHEN {semconv.INGRESS_SQL} THEN {semconv.ROUTED_VERSION_SQL} "
           f"ELSE {semconv.VERSION} END")
REPLICA = semconv.REPLICA
# A request is a span its service served (OpenTelemetry's SERVER kind): a server's start-up
# work (vLLM's "Overall Loading", an internal root span of many seconds) is not one.
REQUEST = "kind = 'server'"
HTTP_STATUS = semconv.HTTP_STATUS
FAILED = semconv.FAILED


def where(time_column: str, since: datetime, until: datetime,
          *filters: tuple[str, Any]) -> tuple[str, list[Any]]:
    """``WHERE`` over a window plus ``expression = value`` for each filter whose value is
    set: only the conditions that apply appear in the SQL an answer cites."""
    conds = [f"{time_column} > ?", f"{time_column} <= ?"]
    params: list[Any] = [since, until]
    for expr, value in filters:
        if value is not None:
            conds.append(f"{expr} = ?")
            params.append(value)
    return "WHERE " + "\n  AND ".join(conds), params


def roots(since: datetime, until: datetime, model: str | None, version: str | None
          ) -> tuple[str, list[Any]]:
    """``FROM spans WHERE ...``: root spans of requests to a model (every model when None)."""
    clause, params = where("start_time", since, until, (MODEL, model), (VERSION, version))
    # Warm-up requests a replica ran on itself before taking traffic are not users'.
    return (f"FROM spans\n{clause}\n  AND parent_span_id IS NULL AND {REQUEST}"
            f"\n  AND {MODEL} IS NOT NULL AND {NOT_WARMUP}", params)


def percentile_columns(percentiles: list[float]) -> str:
    """``quantile_cont`` columns, in milliseconds, named p50_ms, p99_9_ms, ... (percentiles
    are parsed numbers in (0, 100), so writing them into the SQL is safe)."""
    return ", ".join(
        f"round(quantile_cont(duration_ns, {p / 100:.6g}) / 1e6, 1) AS {column(p)}"
        for p in percentiles)


def column(p: float) -> str:
    return f"p{p:g}_ms".replace(".", "_")


def label(p: float) -> str:
    return f"p{p:g}"

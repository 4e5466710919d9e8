"""Synthetic telemetry rows in the project's own tables, for the detector specifications."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pyarrow as pa

from aiops.schema import LOGS, METRIC_POINTS, SPANS
from aiops.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS  # a fixed "now" far from the epoch


def span(start_ns: int, duration_ms: float, model: str = "echo", version: str = "v1",
         service: str | None = None, status: int = 200) -> dict[str, Any]:
    """A model replica span (service = model) or, with service="ingress", the SERVER span."""
    svc = service or model
    attrs = {"gen_ai.request.model": model, "aiops.model.version": version,
             "http.response.status_code": status}
    return {"trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8),
            "name": "POST /v1/chat/completions" if svc == "ingress" else f"chat {model}",
            "kind": "server" if svc == "ingress" else "internal",
            "start_time": start_ns, "end_time": start_ns + int(duration_ms * 1e6),
            "duration_ns": int(duration_ms * 1e6),
            "status_code": "error" if status >= 500 else "unset", "service_name": svc,
            "attributes": json.dumps(attrs)}


def add_spans(store: Store, rows: list[dict[str, Any]]) -> None:
    store.append("spans", pa.Table.from_pylist(rows, schema=SPANS.arrow_schema))


def add_points(store: Store, rows: list[dict[str, Any]]) -> None:
    for r in rows:
        r["attributes"] = json.dumps(r.get("attributes", {}))
    store.append("metric_points", pa.Table.from_pylist(rows, schema=METRIC_POINTS.arrow_schema))


def traffic(store: Store, start_ns: int, seconds: int, per_s: int, duration_ms: float,
            version: str = "v1", status: int = 200, model: str = "echo") -> None:
    """Ingress + model spans, ``per_s`` requests a second."""
    rows = []
    for i in range(seconds * per_s):
        t = start_ns + i * NS // per_s
        rows.append(span(t, duration_ms + (i % 5), model, version, status=status))
        rows.append(span(t, duration_ms + 2 + (i % 5), model, version, "ingress", status))
    add_spans(store, rows)


def log(time_ns: int, body: str, severity: int = 9, service: str = "echo",
        version: str = "v1") -> dict[str, Any]:
    return {"time": time_ns, "observed_time": time_ns, "trace_id": secrets.token_hex(16),
            "severity_number": severity, "body": body, "service_name": service,
            "resource_attributes": json.dumps({"service.version": version})}


def add_logs(store: Store, rows: list[dict[str, Any]]) -> None:
    store.append("logs", pa.Table.from_pylist(rows, schema=LOGS.arrow_schema))

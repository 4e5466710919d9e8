"""One request's telemetry: chat with a trace id of our own, then read its spans, log records
and exemplar-linked metric points back from DuckDB."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx

from aiops.client import ServerClient

__all__ = ["MODEL", "QUESTIONS", "TraceRecords", "chat", "new_traceparent", "records_for_trace",
           "wait_for_trace"]

QUESTIONS = (
    "Paris is the capital of which country?",
    "Name three primary colors.",
    "What color is the sky on a clear day?",
)
MODEL = "smollm2-135m-instruct"

SPANS_SQL = """
SELECT service_name, name, kind, span_id, parent_span_id,
       round(duration_ns / 1e6, 1) AS duration_ms, (attributes->>'inference_id') AS inference_id
FROM spans WHERE trace_id = ? ORDER BY start_time"""
LOGS_SQL = """
SELECT time, service_name, span_id, (attributes->>'inference_id') AS inference_id, body
FROM logs WHERE trace_id = ? ORDER BY time"""
# Metric points carry a trace id only through exemplars: the measurements taken in that trace.
METRICS_SQL = """
SELECT time, service_name, name, type, count, round(sum, 4) AS sum,
       (attributes->>'gen_ai.request.model') AS model,
       (attributes->>'aiops.model.version') AS version
FROM metric_points
WHERE exemplars IS NOT NULL
  AND list_contains(json_extract_string(exemplars, '$[*].trace_id'), ?)
ORDER BY time, name"""


@dataclass(frozen=True)
class TraceRecords:
    spans: list[dict[str, Any]]
    logs: list[dict[str, Any]]
    metric_points: list[dict[str, Any]]

    @property
    def complete(self) -> bool:
        return len(self.spans) >= 2 and bool(self.logs) and bool(self.metric_points)


def new_traceparent() -> tuple[str, str]:
    """A fresh W3C traceparent header and its trace id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id


def chat(serve_url: str, question: str, traceparent: str, max_tokens: int = 64,
         timeout_s: float = 120.0) -> httpx.Response:
    return httpx.post(
        f"{serve_url}/v1/chat/completions", timeout=timeout_s,
        headers={"traceparent": traceparent},
        json={"model": MODEL, "messages": [{"role": "user", "content": question}],
              "max_tokens": max_tokens, "temperature": 0.2, "seed": 7})


def records_for_trace(client: ServerClient, trace_id: str) -> TraceRecords:
    return TraceRecords(client.rows(SPANS_SQL, [trace_id]), client.rows(LOGS_SQL, [trace_id]),
                        client.rows(METRICS_SQL, [trace_id]))


def wait_for_trace(client: ServerClient, trace_id: str, timeout_s: float = 60.0) -> TraceRecords:
    """Poll until the trace's spans, logs and exemplar-linked metric points have landed."""
    deadline = time.monotonic() + timeout_s
    records = records_for_trace(client, trace_id)
    while not records.complete and time.monotonic() < deadline:
        time.sleep(0.5)
        records = records_for_trace(client, trace_id)
    return records

"""The walking-skeleton demo: bring the stack up, chat with the model, read one request's
spans, log records and metric points back from DuckDB by its trace id, shut everything down.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import StackError
from aiops.stack import down, up

__all__ = ["QUESTIONS", "TraceRecords", "chat", "records_for_trace", "run_demo"]

QUESTIONS = (
    "Paris is the capital of which country?",
    "Name three primary colors.",
    "What color is the sky on a clear day?",
)
MODEL = "smollm2-135m-instruct"

SPANS_SQL = """
SELECT service_name, name, kind, span_id, parent_span_id,
       round(duration_ns / 1e6, 1) AS duration_ms, attributes->>'inference_id' AS inference_id
FROM spans WHERE trace_id = ? ORDER BY start_time"""
LOGS_SQL = """
SELECT time, service_name, span_id, attributes->>'inference_id' AS inference_id, body
FROM logs WHERE trace_id = ? ORDER BY time"""
# Metric points carry a trace id only through exemplars: the measurements taken in that trace.
METRICS_SQL = """
SELECT time, service_name, name, type, count, round(sum, 4) AS sum,
       attributes->>'gen_ai.request.model' AS model,
       attributes->>'aiops.model.version' AS version
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


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=title, show_lines=False)
    if not rows:
        t.add_column("(none)")
        return t
    for col in rows[0]:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r.values()))
    return t


def run_demo(settings: Settings, console: Console) -> None:
    up(settings, progress=console.log)
    try:
        traces = []
        for q in QUESTIONS:
            traceparent, trace_id = new_traceparent()
            resp = chat(settings.serve_url, q, traceparent)
            if resp.status_code != 200:
                raise StackError(f"chat request failed: HTTP {resp.status_code} {resp.text}")
            answer = resp.json()["choices"][0]["message"]["content"].strip()
            console.print(f"[bold]Q:[/bold] {q}\n[bold green]A:[/bold green] {answer}\n"
                          f"[dim]trace_id={trace_id} "
                          f"inference_id={resp.headers.get('x-inference-id')}[/dim]\n")
            traces.append(trace_id)
        trace_id = traces[0]
        console.log(f"reading trace {trace_id} back from DuckDB")
        with ServerClient(settings.server_url) as client:
            records = wait_for_trace(client, trace_id)
        console.print(_table(f"spans of trace {trace_id}", records.spans))
        console.print(_table("log records with that trace_id", records.logs))
        console.print(_table("metric points whose exemplars carry that trace_id",
                             records.metric_points))
        with ServerClient(settings.server_url) as client:
            console.print(_table("its provenance entry (hash-chained)", client.rows(
                "SELECT seq, model, version, left(artifact_digest, 19) AS artifact, "
                "left(input_hash, 19) AS input, left(hash, 12) AS hash FROM provenance "
                "WHERE trace_id = ?", [trace_id])))
            report = httpx.get(f"{settings.server_url}/api/v1/ledger/provenance/verify",
                               timeout=60).json()
        console.print(f"provenance chain: {report['entries']} entries, "
                      f"{'intact' if report['ok'] else 'TAMPERED: ' + str(report['problems'])}")
        if not records.complete:
            raise StackError(f"trace {trace_id} is incomplete in DuckDB: "
                             f"{len(records.spans)} spans, {len(records.logs)} logs, "
                             f"{len(records.metric_points)} metric points")
    finally:
        down(settings, progress=console.log)

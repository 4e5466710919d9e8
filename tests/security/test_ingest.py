"""The OTLP/HTTP receiver holds up against hostile or broken senders: slow uploads cannot hold
the ingest memory budget, out-of-range times and invalid ids or kinds are rejected per record
(OTLP partial success) instead of being stored wrapped, and only the serving stack's
credential may write hash-chained provenance records."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client import CollectorRegistry

from aiops.auth import Principal
from aiops.config import load_settings
from aiops.ledger import PROVENANCE_EVENT
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from collectors.otlp import decode as decode_module
from collectors.otlp.decode import MAX_TIME_NS, decode
from collectors.otlp.receiver import ReceiverMetrics, make_router
from collectors.otlp.writer import BatchWriter, MemoryBudget
from tests.conftest import RunningServer
from tests.loopback import serving

PROTOBUF = {"content-type": "application/x-protobuf"}
NOW = time.time_ns()
WRAPS = 2**63 + 5  # as int64 nanoseconds: 1677-09-21, before the epoch
TOP = 2**64 - 1  # the largest fixed64; as int64: -1 ns, 1969-12-31
DECODERS = [pytest.param(False, id="python"), pytest.param(True, id="compiled", marks=(
    pytest.mark.skipif(decode_module._wire is None, reason="compiled decoder not built")))]


def span(**fields: Any) -> Span:
    values: dict[str, Any] = {"trace_id": secrets.token_bytes(16),
                              "span_id": secrets.token_bytes(8), "name": "op",
                              "start_time_unix_nano": NOW, "end_time_unix_nano": NOW + 1000}
    values.update(fields)
    return Span(**values)


def traces(*spans: Span) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=list(spans))])]).SerializeToString()


def logs(*records: LogRecord) -> bytes:
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        scope_logs=[ScopeLogs(log_records=list(records))])]).SerializeToString()


def provenance_record(inference_id: str) -> LogRecord:
    attrs = {"model": "m", "version": "v1", "artifact_digest": "sha256:a",
             "input_hash": "sha256:b", "hardware": "sha256:c", "inference_id": inference_id}
    return LogRecord(time_unix_nano=NOW, event_name=PROVENANCE_EVENT,
                     trace_id=secrets.token_bytes(16), attributes=[
                         KeyValue(key=k, value=AnyValue(string_value=v))
                         for k, v in attrs.items()])


def export(url: str, signal: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/{signal}", content=body, headers={**PROTOBUF, **headers},
                      timeout=30)


# --- slow uploads ---------------------------------------------------------------------------

READ_TIMEOUT_S = 2.0
# Two uploads announcing this much would, reserved at 12x before reading, take 8.16 of the
# 8 MiB budget: every real export would get 503 for as long as they idle.
ANNOUNCED = 340_000


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[tuple[str, FastAPI]]:
    """The real server app (8 MiB ingest budget, 2 s read deadline) in uvicorn on loopback."""
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             scrape_targets="", ingest_memory_mb=8,
                             ingest_read_timeout_s=READ_TIMEOUT_S)
    store = Store(settings.db_path)
    app = create_app(settings, store)
    try:
        with serving(app, settings.server_port) as url:
            yield url, app
    finally:
        store.close()


def start_slow_upload(url: str, announced: int) -> socket.socket:
    """A raw connection that announces ``announced`` body bytes, sends 10 and goes quiet."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Content-Type: application/x-protobuf\r\nContent-Length: {announced}\r\n"
                 "\r\n".encode() + b"\x0a" * 10)
    return sock


def read_response(sock: socket.socket, wait_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``wait_s`` passes)."""
    sock.settimeout(wait_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_slow_uploads_hold_no_budget_and_get_408_within_the_read_deadline(
    small_server: tuple[str, FastAPI],
) -> None:
    url, app = small_server
    body = traces(*[span(attributes=[KeyValue(key="k", value=AnyValue(string_value="v" * 60))])
                    for _ in range(300)])
    assert 12 * len(body) > 8 * 2**20 - 2 * 12 * ANNOUNCED  # would not fit beside them
    started = time.monotonic()
    slow = [start_slow_upload(url, ANNOUNCED) for _ in range(2)]
    try:
        time.sleep(0.3)  # both are in the handler, waiting for their bodies
        for _ in range(3):
            r = export(url, "traces", body)
            assert r.status_code == 200, r.text
        # They hold what they sent (10 bytes each), not what they announced.
        assert app.state.budget.used < 1000
        replies = [read_response(s, READ_TIMEOUT_S + 3) for s in slow]
        elapsed = time.monotonic() - started
    finally:
        for s in slow:
            s.close()
    assert elapsed < READ_TIMEOUT_S + 3
    for reply in replies:
        # 408 with an OTLP google.rpc.Status body, then the connection closed.
        head, _, payload = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"connection: close" in head.lower()
        status = status_pb2.Status.FromString(payload)
        assert status.code == 4 and "not received within 2 s" in status.message
    deadline = time.monotonic() + 5
    while app.state.budget.used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.budget.used == 0  # what they held went back


def test_an_upload_that_trickles_in_within_the_deadline_is_accepted(
    small_server: tuple[str, FastAPI],
) -> None:
    url, _ = small_server
    body = traces(span(), span())
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Content-Type: application/x-protobuf\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode())
        for i in range(0, len(body), len(body) // 3 + 1):
            time.sleep(0.2)
            sock.sendall(body[i:i + len(body) // 3 + 1])
        reply = read_response(sock, 10)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


# --- out-of-range times, all-zero ids, unknown kinds ----------------------------------------


def outcome(signal: str, body: bytes, compiled: bool) -> tuple[int, str | None, int]:
    result = decode(signal, body, "protobuf", compiled=compiled)
    return result.rejected, result.message, sum(t.num_rows for t in result.values())


@pytest.mark.parametrize("compiled", DECODERS)
@pytest.mark.parametrize(("bad", "reason"), [
    pytest.param(span(start_time_unix_nano=WRAPS, end_time_unix_nano=WRAPS + 10),
                 "start_time_unix_nano 9223372036854775813 is out of range", id="start>=2^63"),
    pytest.param(span(end_time_unix_nano=TOP),
                 "end_time_unix_nano 18446744073709551615 is out of range", id="end=2^64-1"),
    pytest.param(span(start_time_unix_nano=MAX_TIME_NS, end_time_unix_nano=0),
                 "is out of range", id="start=2262"),
    pytest.param(span(end_time_unix_nano=NOW - 1), "ends before it starts", id="end<start"),
    pytest.param(span(events=[Span.Event(time_unix_nano=WRAPS, name="e")]),
                 "event time out of range", id="event>=2^63"),
    pytest.param(span(trace_id=bytes(16)), "all-zero trace_id", id="zero-trace-id"),
    pytest.param(span(span_id=bytes(8)), "span_id is all zeros", id="zero-span-id"),
    pytest.param(span(kind=99), "unknown kind 99", id="kind-99"),
    pytest.param(span(kind=-1), "unknown kind -1", id="kind-minus-1"),
])
def test_invalid_spans_are_rejected_with_a_reason_by_both_decoders(
    compiled: bool, bad: Span, reason: str,
) -> None:
    rejected, message, rows = outcome("traces", traces(span(), bad, span(kind=2)), compiled)
    assert (rejected, rows) == (1, 2)
    assert message is not None and reason in message
    if decode_module._wire is not None:  # and both say the same
        assert outcome("traces", traces(bad, span()), True) == \
            outcome("traces", traces(bad, span()), False)


@pytest.mark.parametrize("compiled", DECODERS)
def test_log_records_with_out_of_range_times_are_rejected_by_both_decoders(
    compiled: bool,
) -> None:
    body = logs(LogRecord(time_unix_nano=NOW, body=AnyValue(string_value="ok")),
                LogRecord(time_unix_nano=WRAPS), LogRecord(observed_time_unix_nano=TOP))
    rejected, message, rows = outcome("logs", body, compiled)
    assert (rejected, rows) == (2, 1)
    assert message == ("log record time_unix_nano 9223372036854775813 is out of range "
                       "(times must be below 2262-01-01T00:00:00Z)")


def test_the_server_commits_the_valid_rest_and_says_what_it_left_out(
    server: RunningServer,
) -> None:
    good = span(end_time_unix_nano=NOW + 5000, kind=2)
    body = traces(good, span(start_time_unix_nano=WRAPS, end_time_unix_nano=TOP),
                  span(end_time_unix_nano=NOW - 1), span(trace_id=bytes(16)), span(kind=99))
    r = export(server.url, "traces", body)
    assert r.status_code == 200
    reply = ExportTraceServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_spans == 4
    assert "out of range" in reply.partial_success.error_message
    rows = server.store.query("SELECT span_id, epoch_ns(start_time), duration_ns, kind "
                              "FROM spans").rows
    assert [tuple(row) for row in rows] == [(good.span_id.hex(), NOW, 5000, "server")]


def test_json_logs_and_metrics_with_wrapping_times_are_partial_successes(
    server: RunningServer,
) -> None:
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": str(NOW), "body": {"stringValue": "kept"}},
        {"timeUnixNano": str(WRAPS), "body": {"stringValue": "1677"}},
    ]}]}]}
    r = httpx.post(f"{server.url}/v1/logs", json=doc)
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedLogRecords"] == "1"
    metrics = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "g", "gauge": {
        "dataPoints": [{"timeUnixNano": str(NOW), "asDouble": 1.0},
                       {"timeUnixNano": str(TOP), "asDouble": 2.0},
                       {"timeUnixNano": str(NOW), "startTimeUnixNano": str(WRAPS),
                        "asDouble": 3.0}]}}]}]}]}
    r = httpx.post(f"{server.url}/v1/metrics", json=metrics)
    assert r.status_code == 200
    partial = r.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "2" and "out of range" in partial["errorMessage"]
    assert server.store.query("SELECT body FROM logs").rows == [("kept",)]
    assert server.store.query("SELECT value FROM metric_points WHERE name = 'g'").rows == \
        [(1.0,)]


# --- provenance needs the serving stack's credential ----------------------------------------

PRINCIPALS = {"serve": Principal("serve", ingest=True, provenance=True),
              "ebpf": Principal("ebpf", ingest=True, provenance=False)}


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """The OTLP router alone, in uvicorn on loopback, behind a stand-in for the auth layer
    that names the request's principal from an ``x-principal`` header (none: no principal)."""
    store = Store(tmp_path / "t.duckdb")
    writer = BatchWriter(store)
    app = FastAPI()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        name = request.headers.get("x-principal")
        if name:
            request.state.principal = PRINCIPALS[name]
        return await call_next(request)

    app.include_router(make_router(writer, MemoryBudget(64 * 2**20), 2**20,
                                   ReceiverMetrics.create(CollectorRegistry())))
    try:
        with serving(app) as url:
            yield url, store
    finally:
        writer.close()
        store.close()


@pytest.mark.parametrize("principal", [None, "ebpf"])
def test_provenance_without_the_serving_stacks_credential_is_rejected(
    receiver: tuple[str, Store], principal: str | None,
) -> None:
    url, store = receiver
    body = logs(provenance_record("inf-1"), LogRecord(time_unix_nano=NOW,
                                                      body=AnyValue(string_value="kept")))
    r = export(url, "logs", body, **({"x-principal": principal} if principal else {}))
    assert r.status_code == 200
    reply = ExportLogsServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_log_records == 1
    assert "serving stack's credential" in reply.partial_success.error_message
    assert store.query("SELECT count(*) FROM provenance").rows == [(0,)]
    # The other records of the request are committed; the provenance one is not a log either.
    assert store.query("SELECT body, event_name FROM logs").rows == [("kept", None)]


def test_provenance_with_the_serving_stacks_credential_is_chained(
    receiver: tuple[str, Store],
) -> None:
    url, store = receiver
    r = export(url, "logs", logs(provenance_record("inf-2")), **{"x-principal": "serve"})
    assert r.status_code == 200
    reply = ExportLogsServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_log_records == 0
    assert reply.partial_success.error_message == ""
    assert store.query("SELECT inference_id FROM provenance").rows == [("inf-2",)]

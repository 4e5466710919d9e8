"""The aiops server on a real loopback port: OTLP in from the official exporters, errors out."""

from __future__ import annotations

import gzip
import json
import logging

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.logging.handler import LoggingHandler
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.conftest import RunningServer

RESOURCE = Resource.create({"service.name": "checkout", "service.version": "v7"})


def test_health_and_readiness(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_spans_from_the_official_exporter_land_in_duckdb(server: RunningServer) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", compression=Compression.Gzip)))
    tracer = provider.get_tracer("test.scope", "1.2.3")
    with (tracer.start_as_current_span("GET /cart", kind=SpanKind.SERVER) as parent,
          tracer.start_as_current_span("db.query", attributes={"db.rows": 3}) as child):
        child.add_event("retry", {"attempt": 2})
        child.set_status(Status(StatusCode.ERROR, "timeout"))
    provider.shutdown()
    trace_id = f"{parent.get_span_context().trace_id:032x}"
    rows = server.store.query(
        "SELECT name, kind, span_id, parent_span_id, status_code, status_message, service_name,"
        " scope_name, scope_version, (attributes->>'db.rows'), events->0->>'name', "
        " duration_ns > 0 FROM spans WHERE trace_id = ? ORDER BY start_time", [trace_id]).rows
    parent_id = f"{parent.get_span_context().span_id:016x}"
    child_id = f"{child.get_span_context().span_id:016x}"
    assert rows == [
        ("GET /cart", "server", parent_id, None, "unset", None, "checkout", "test.scope",
         "1.2.3", None, None, True),
        ("db.query", "internal", child_id, parent_id, "error", "timeout", "checkout",
         "test.scope", "1.2.3", "3", "retry", True),
    ]


def test_logs_keep_their_trace_context(server: RunningServer) -> None:
    logs = LoggerProvider(resource=RESOURCE)
    logs.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.url}/v1/logs")))
    tracer_provider = TracerProvider(resource=RESOURCE)
    logger = logging.getLogger("test.otlp.logs")
    logger.propagate = False
    handler = LoggingHandler(logger_provider=logs)
    logger.addHandler(handler)
    try:
        with tracer_provider.get_tracer("t").start_as_current_span("work") as span:
            logger.warning("cart %s is empty", "c-1", extra={"inference_id": "inf-1"})
    finally:
        logger.removeHandler(handler)
        logs.shutdown()
    ctx = span.get_span_context()
    row = server.store.query(
        "SELECT trace_id, span_id, severity_text, body, (attributes->>'inference_id') FROM logs"
    ).rows
    assert row == [(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", "WARN", "cart c-1 is empty",
                    "inf-1")]


def test_metric_points_keep_type_labels_and_buckets(server: RunningServer) -> None:
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{server.url}/v1/metrics"), export_interval_millis=3_600_000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("m")
    meter.create_counter("requests").add(5, {"model": "llama"})
    hist = meter.create_histogram("latency", unit="s")
    for v in (0.004, 0.2, 3.0):
        hist.record(v, {"model": "llama"})
    meter.create_gauge("queue_depth").set(7, {"model": "llama"})
    provider.shutdown()
    rows = {r[0]: r[1:] for r in server.store.query(
        "SELECT name, type, temporality, is_monotonic, value, count, sum, "
        "list_sum(bucket_counts), (attributes->>'model') FROM metric_points").rows}
    assert rows["requests"] == ("sum", "cumulative", True, 5.0, None, None, None, "llama")
    assert rows["latency"][:3] == ("histogram", "cumulative", None)
    assert rows["latency"][4:] == (3, pytest.approx(3.204), 3, "llama")
    assert rows["queue_depth"] == ("gauge", None, None, 7.0, None, None, None, "llama")


OTLP_JSON_TRACE = {
    "resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
        "scopeSpans": [{
            "scope": {"name": "manual"},
            "spans": [{
                "traceId": "5b8efff798038103d269b633813fc60c",
                "spanId": "eee19b7ec3c1b174",
                "parentSpanId": "eee19b7ec3c1b173",
                "name": "I'm a server span",
                "startTimeUnixNano": "1544712660000000000",
                "endTimeUnixNano": "1544712661000000000",
                "kind": 2,
                "traceState": "vendor=a",
                "attributes": [{"key": "my.span.attr", "value": {"stringValue": "some value"}}],
                "links": [{"traceId": "5b8efff798038103d269b633813fc60d",
                           "spanId": "eee19b7ec3c1b170", "traceState": "vendor=b"}],
            }],
        }],
    }],
}


def test_otlp_json_with_hex_ids(server: RunningServer) -> None:
    resp = httpx.post(f"{server.url}/v1/traces", json=OTLP_JSON_TRACE)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert server.store.query(
        "SELECT trace_id, span_id, parent_span_id, kind, duration_ns, service_name, trace_state,"
        " links->0->>'trace_state', links->0->>'trace_id' FROM spans"
    ).rows == [("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "eee19b7ec3c1b173",
                "server", 1_000_000_000, "api", "vendor=a", "vendor=b",
                "5b8efff798038103d269b633813fc60d")]


PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(("path", "headers", "body", "status", "message"), [
    ("/v1/traces", PROTOBUF, b"\xff\xff\xff\xff", 400, "not a valid OTLP traces protobuf"),
    ("/v1/logs", JSON, b"{not json", 400, "not valid JSON"),
    ("/v1/metrics", JSON, b'{"resourceMetrics": "nope"}', 400, "not a valid OTLP metrics JSON"),
    ("/v1/traces", JSON, b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/traces", {"content-type": "text/plain"}, b"hello", 415, "text/plain"),
    ("/v1/traces", {}, b"", 415, "(none)"),
    ("/v1/traces", {**JSON, "content-encoding": "gzip"}, b"not gzip", 400, "not valid gzip"),
    ("/v1/traces", {**JSON, "content-encoding": "br"}, b"{}", 415, "'br'"),
    ("/v1/traces", JSON, json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "abcd", "spanId": "eee19b7ec3c1b174", "name": "x",
         "startTimeUnixNano": "1"}]}]}]}).encode(), 400, "trace_id must be 16 bytes"),
    ("/v1/traces", JSON, json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "zz", "spanId": "eee19b7ec3c1b174"}]}]}]}).encode(), 400, "hex"),
])
def test_malformed_bodies_get_a_4xx_with_a_message_and_the_server_carries_on(
    server: RunningServer, path: str, headers: dict[str, str], body: bytes, status: int,
    message: str,
) -> None:
    resp = httpx.post(f"{server.url}{path}", content=body, headers=headers)
    assert resp.status_code == status
    if resp.headers["content-type"] == "application/x-protobuf":
        text = status_pb2.Status.FromString(resp.content).message
    else:
        text = resp.json()["message"]
    assert message in text
    # Still serving, still accepting good data.
    assert httpx.post(f"{server.url}/v1/traces", json=OTLP_JSON_TRACE).status_code == 200


def test_oversized_bodies_get_413(server: RunningServer) -> None:
    limit = server.settings.max_body_bytes
    big = b"{" + b" " * limit + b"}"
    resp = httpx.post(f"{server.url}/v1/traces", content=big, headers=JSON)
    assert resp.status_code == 413 and "exceeds the limit" in resp.json()["message"]
    bomb = gzip.compress(b"{" + b" " * (limit * 4) + b"}")
    assert len(bomb) < limit
    resp = httpx.post(f"{server.url}/v1/traces", content=bomb,
                      headers={**JSON, "content-encoding": "gzip"})
    assert resp.status_code == 413 and "decompressed" in resp.json()["message"]


def test_sql_endpoint_reads_and_refuses_writes(server: RunningServer) -> None:
    httpx.post(f"{server.url}/v1/traces", json=OTLP_JSON_TRACE)
    ok = httpx.post(f"{server.url}/api/v1/sql",
                    json={"sql": "SELECT name, start_time FROM spans WHERE kind = ?",
                          "params": ["server"]})
    assert ok.status_code == 200
    assert ok.json()["rows"] == [["I'm a server span", "2018-12-13T14:51:00"]]
    for bad, status in [({"sql": "DELETE FROM spans"}, 400), ({"sql": "SELECT * FROM nope"}, 400),
                        ({"sql": ""}, 400), ({"query": "SELECT 1"}, 400)]:
        resp = httpx.post(f"{server.url}/api/v1/sql", json=bad)
        assert resp.status_code == status and resp.json()["error"], bad
    assert server.store.count("spans") == 1


def test_own_metrics_count_requests_and_rows(server: RunningServer) -> None:
    httpx.post(f"{server.url}/v1/traces", json=OTLP_JSON_TRACE)
    httpx.post(f"{server.url}/v1/traces", content=b"x", headers={"content-type": "text/plain"})
    text = httpx.get(f"{server.url}/metrics").text
    assert 'aiops_otlp_requests_total{code="200",signal="traces",transport="http"} 1.0' in text
    assert 'aiops_otlp_requests_total{code="415",signal="traces",transport="http"} 1.0' in text
    assert 'aiops_otlp_rows_total{table="spans"} 1.0' in text


def test_a_partly_invalid_request_commits_the_rest_and_says_what_was_rejected(
    server: RunningServer,
) -> None:
    good = OTLP_JSON_TRACE["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    bad = {**good, "traceId": "abcd", "spanId": "eee19b7ec3c1b175"}
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]}
    resp = httpx.post(f"{server.url}/v1/traces", json=body)
    assert resp.status_code == 200
    assert resp.json() == {"partialSuccess": {
        "rejectedSpans": "1", "errorMessage": "trace_id must be 16 bytes, got 2"}}
    assert server.store.count("spans") == 1
    assert 'aiops_otlp_rejected_records_total{signal="traces"} 1.0' in \
        httpx.get(f"{server.url}/metrics").text


def test_own_metrics_say_how_long_the_analytics_rounds_take(server: RunningServer) -> None:
    """The observer's own cost: rounds so far and the last and longest round's seconds."""
    import re
    import time

    deadline = time.monotonic() + 15
    rounds = 0.0
    while time.monotonic() < deadline and rounds < 2:
        text = httpx.get(f"{server.url}/metrics").text
        found = re.search(r"^aiops_analytics_rounds (\S+)$", text, re.M)
        rounds = float(found.group(1)) if found else 0.0
        time.sleep(0.5)
    assert rounds >= 2, text
    last = float(re.search(r"^aiops_analytics_round_seconds (\S+)$", text, re.M).group(1))
    most = float(re.search(r"^aiops_analytics_round_max_seconds (\S+)$", text, re.M).group(1))
    assert 0 < last <= most < 10

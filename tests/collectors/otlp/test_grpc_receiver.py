"""OTLP/gRPC on its standard port's role: what the OpenTelemetry SDK's own gRPC exporters send
(plain and gzip) lands as OTLP/HTTP's does, through the same decoder and writer; the very same
request bytes make the same rows over either transport."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import trustme
from grpc import Compression
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from aiops.config import Settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from collectors.otlp.grpc_receiver import SERVICES
from tests.conftest import RunningServer
from tests.loopback import serving

RESOURCE = Resource.create({"service.name": "grpc-conformance"})


@pytest.fixture
def both(settings: Settings) -> Iterator[tuple[RunningServer, str]]:
    """The server with OTLP/HTTP and OTLP/gRPC; the gRPC target as host:port."""
    settings = settings.model_copy(update={"otlp_grpc_port": free_port()})
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port, settings):
            yield (RunningServer(settings.server_url, store, settings),
                   f"127.0.0.1:{settings.otlp_grpc_port}")
    finally:
        store.close()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip],
                         ids=["plain", "gzip"])
def test_the_sdks_grpc_exporters_land_spans_logs_and_metrics(
        both: tuple[RunningServer, str], compression: Compression) -> None:
    server, target = both
    tracing = TracerProvider(resource=RESOURCE)
    tracing.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=target, insecure=True, compression=compression)))
    with tracing.get_tracer("grpc.scope").start_as_current_span(
            "infer", attributes={"gen_ai.request.model": "m", "http.response.status_code": 503}):
        pass
    tracing.shutdown()
    logging = LoggerProvider(resource=RESOURCE)
    logging.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(
        endpoint=target, insecure=True, compression=compression)))
    logging.get_logger("grpc.logs").emit(body="replica started",
                                         severity_number=SeverityNumber.INFO)
    logging.shutdown()
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(
        endpoint=target, insecure=True, compression=compression),
        export_interval_millis=3_600_000)
    metering = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    metering.get_meter("grpc.metrics").create_counter("tokens").add(7)
    metering.shutdown()

    q = server.store.query
    assert q("SELECT name, service_name, model, http_status, failed, scope_name FROM spans"
             ).rows == [("infer", "grpc-conformance", "m", 503, True, "grpc.scope")]
    assert q("SELECT body, service_name FROM logs").rows == [
        ("replica started", "grpc-conformance")]
    assert q("SELECT name, value FROM metric_points").rows == [("tokens", 7.0)]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'aiops_otlp_requests_total{code="OK",signal="traces",transport="grpc"} 1.0' in metrics


def request_bytes() -> bytes:
    now = time.time_ns()
    spans = [Span(trace_id=secrets.token_bytes(16), span_id=secrets.token_bytes(8),
                  name=f"op-{i}", kind=2, start_time_unix_nano=now,
                  end_time_unix_nano=now + 1000 * i + 1,
                  attributes=[KeyValue(key="gen_ai.request.model",
                                       value=AnyValue(string_value="m"))]) for i in range(3)]
    resource = ResourceProto(attributes=[KeyValue(key="service.name",
                                                  value=AnyValue(string_value="same"))])
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def test_the_same_request_bytes_make_the_same_rows_over_grpc_and_http(
        both: tuple[RunningServer, str]) -> None:
    server, target = both
    body = request_bytes()
    r = httpx.post(f"{server.url}/v1/traces", content=body,
                   headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 200, r.text
    with grpc.insecure_channel(target) as channel:
        reply = channel.unary_unary(f"/{SERVICES['traces']}/Export")(body, timeout=10)
    assert ExportTraceServiceResponse.FromString(reply) == ExportTraceServiceResponse()
    rows = server.store.query("SELECT * FROM spans ORDER BY name").rows
    assert len(rows) == 6 and rows[0::2] == rows[1::2]  # each span twice, identical


def test_with_the_http_sides_certificate_it_speaks_tls_only(settings: Settings,
                                                            tmp_path: Path) -> None:
    """The HTTP side's certificate and key serve gRPC too: an exporter trusting the CA lands
    its spans; a plaintext one does not get through."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "server.pem",
             "key": tmp_path / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    settings = settings.model_copy(update={
        "otlp_grpc_port": free_port(), "server_tls_cert": files["cert"],
        "server_tls_key": files["key"], "server_tls_ca": files["ca"]})
    store = Store(settings.db_path)
    target = f"127.0.0.1:{settings.otlp_grpc_port}"
    method = f"/{SERVICES['traces']}/Export"
    try:
        with serving(create_app(settings, store), settings.server_port, settings):
            credentials = grpc.ssl_channel_credentials(files["ca"].read_bytes())
            with grpc.secure_channel(target, credentials) as channel:
                channel.unary_unary(method)(request_bytes(), timeout=10)
            with grpc.insecure_channel(target) as channel, \
                    pytest.raises(grpc.RpcError) as plain:
                channel.unary_unary(method)(request_bytes(), timeout=5)
            assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
            assert store.query("SELECT count(*) FROM spans").rows == [(3,)]
    finally:
        store.close()

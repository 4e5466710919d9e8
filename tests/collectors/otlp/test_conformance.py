"""OTLP conformance: what the official OpenTelemetry exporters send round-trips into DuckDB,
field by field, for all three signals."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState

from tests.conftest import RunningServer

RESOURCE = Resource.create({"service.name": "conformance", "deployment.environment": "test",
                            "host.cpus": 2})


def test_spans_keep_links_trace_state_limits_events_status_and_scope(
    server: RunningServer,
) -> None:
    provider = TracerProvider(resource=RESOURCE, span_limits=SpanLimits(max_span_attributes=2))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{server.url}/v1/traces")))
    tracer = provider.get_tracer("conf.scope", "9.9")
    linked = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "x")]))
    with tracer.start_as_current_span(
        "call", kind=SpanKind.CLIENT, links=[Link(linked, {"link.kind": "retry"})],
        attributes={"a": 1, "b": "two", "c": 3.5, "d": True},
    ) as span:
        span.add_event("chunk", {"bytes": 10, "tags": ["x", "y"]})
        span.set_status(trace.Status(trace.StatusCode.OK))
    provider.shutdown()
    row = server.store.query(
        "SELECT kind, status_code, scope_name, scope_version, attributes, "
        "dropped_attributes_count, events, links, resource_attributes FROM spans").rows[0]
    kind, status, scope, version, attributes, dropped, events, links, resource = row
    assert (kind, status, scope, version) == ("client", "ok", "conf.scope", "9.9")
    # The SDK kept two of the four attributes and says it dropped two.
    assert len(json.loads(attributes)) == 2 and dropped == 2
    (event,) = json.loads(events)
    assert event["name"] == "chunk" and event["attributes"] == {"bytes": 10, "tags": ["x", "y"]}
    assert event["time"] > 0
    (link,) = json.loads(links)
    # opentelemetry-exporter-otlp-proto-common 1.45 does not encode a link's trace state;
    # the receiver keeps whatever arrives (see the OTLP/JSON test for a non-empty one).
    assert link == {"trace_id": f"{0xABC:032x}", "span_id": f"{0xDEF:016x}",
                    "trace_state": "", "attributes": {"link.kind": "retry"}}
    res = json.loads(resource)
    assert res["service.name"] == "conformance" and res["host.cpus"] == 2


def test_logs_keep_event_names_structured_bodies_severity_and_flags(
    server: RunningServer,
) -> None:
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.url}/v1/logs")))
    logger = provider.get_logger("conf.logs", "1.0")
    tracer = TracerProvider(resource=RESOURCE).get_tracer("t")
    with tracer.start_as_current_span("op") as span:
        logger.emit(body={"event": "oom", "sizes": [1, 2.5]}, event_name="gpu.oom",
                    severity_number=SeverityNumber.ERROR, severity_text="ERROR",
                    attributes={"gpu": 0})
    provider.shutdown()
    row = server.store.query(
        "SELECT body, event_name, severity_number, severity_text, attributes, trace_id, "
        "flags, scope_name, scope_version, time IS NOT NULL, observed_time IS NOT NULL "
        "FROM logs").rows[0]
    ctx = span.get_span_context()
    assert json.loads(row[0]) == {"event": "oom", "sizes": [1, 2.5]}
    assert row[1:5] == ("gpu.oom", 17, "ERROR", '{"gpu":0}')
    assert row[5] == f"{ctx.trace_id:032x}"
    assert row[6] == int(ctx.trace_flags)  # sampled (and W3C "random" when the SDK sets it)
    assert row[7:] == ("conf.logs", "1.0", True, True)


def test_metrics_keep_delta_sums_updown_counters_exp_histograms_and_exemplars(
    server: RunningServer,
) -> None:
    exporter = OTLPMetricExporter(
        endpoint=f"{server.url}/v1/metrics",
        preferred_temporality={Counter: AggregationTemporality.DELTA})
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader], views=[
        View(instrument_name="ttft", aggregation=ExponentialBucketHistogramAggregation())])
    meter = provider.get_meter("conf.metrics")
    tracer = TracerProvider(resource=RESOURCE).get_tracer("t")
    meter.create_counter("tokens").add(7, {"model": "m"})
    meter.create_up_down_counter("in_flight").add(-2)
    ttft = meter.create_histogram("ttft", unit="s")
    with tracer.start_as_current_span("req") as span:
        for v in (0.01, 0.02, 0.4):
            ttft.record(v)
    provider.shutdown()
    rows = {r[0]: r[1:] for r in server.store.query(
        "SELECT name, type, temporality, is_monotonic, value, count, exp_histogram, "
        "exemplars, unit FROM metric_points").rows}
    assert rows["tokens"][:4] == ("sum", "delta", True, 7.0)
    assert rows["in_flight"][:4] == ("sum", "cumulative", False, -2.0)
    kind, temporality, _, _, count, exp, exemplars, unit = rows["ttft"]
    assert (kind, temporality, count, unit) == ("exponential_histogram", "cumulative", 3, "s")
    exp = json.loads(exp)
    assert sum(exp["positive"]["bucket_counts"]) == 3 and "scale" in exp
    trace_ids = {e["trace_id"] for e in json.loads(exemplars)}
    assert f"{span.get_span_context().trace_id:032x}" in trace_ids

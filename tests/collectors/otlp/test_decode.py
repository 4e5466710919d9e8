"""OTLP decoding keeps every kind of record, in both encodings."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Metric,
    ResourceMetrics,
    ScopeMetrics,
    Summary,
    SummaryDataPoint,
)

from aiops.errors import DecodeError
from collectors.otlp.decode import decode

T = 1_700_000_000_000_000_000


def metrics_request(*metrics: Metric) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        scope_metrics=[ScopeMetrics(metrics=list(metrics))])])


def test_summary_points_keep_their_quantiles() -> None:
    m = Metric(name="rpc_latency", summary=Summary(data_points=[SummaryDataPoint(
        time_unix_nano=T, count=10, sum=2.5,
        quantile_values=[SummaryDataPoint.ValueAtQuantile(quantile=0.99, value=0.8)])]))
    row = decode("metrics", metrics_request(m).SerializeToString(), "protobuf")[
        "metric_points"].to_pylist()[0]
    assert (row["type"], row["count"], row["sum"]) == ("summary", 10, 2.5)
    assert json.loads(row["quantiles"]) == [{"quantile": 0.99, "value": 0.8}]


def test_exponential_histograms_keep_scale_and_buckets() -> None:
    m = Metric(name="ttft", exponential_histogram=ExponentialHistogram(
        aggregation_temporality=1, data_points=[ExponentialHistogramDataPoint(
            time_unix_nano=T, count=3, sum=1.5, scale=2, zero_count=1,
            positive=ExponentialHistogramDataPoint.Buckets(offset=-1, bucket_counts=[1, 1]))]))
    row = decode("metrics", metrics_request(m).SerializeToString(), "protobuf")[
        "metric_points"].to_pylist()[0]
    assert (row["type"], row["temporality"], row["count"]) == ("exponential_histogram", "delta", 3)
    exp = json.loads(row["exp_histogram"])
    assert exp["scale"] == 2 and exp["zero_count"] == 1
    assert exp["positive"] == {"offset": -1, "bucket_counts": [1, 1]}


def test_structured_log_bodies_and_attribute_values_become_json() -> None:
    body = AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key="event", value=AnyValue(string_value="oom")),
        KeyValue(key="sizes", value=AnyValue(array_value=ArrayValue(values=[
            AnyValue(int_value=1), AnyValue(double_value=2.5)])))]))
    req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[LogRecord(time_unix_nano=T, severity_number=17, body=body, attributes=[
            KeyValue(key="blob", value=AnyValue(bytes_value=b"\x00\x01")),
            KeyValue(key="ok", value=AnyValue(bool_value=True))])])])])
    row = decode("logs", req.SerializeToString(), "protobuf")["logs"].to_pylist()[0]
    assert json.loads(row["body"]) == {"event": "oom", "sizes": [1, 2.5]}
    assert json.loads(row["attributes"]) == {"blob": "AAE=", "ok": True}
    assert row["trace_id"] is None and row["severity_number"] == 17


def test_json_and_protobuf_encodings_decode_to_the_same_rows() -> None:
    req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[LogRecord(time_unix_nano=T, body=AnyValue(string_value="hi"),
                               trace_id=bytes(range(16)), span_id=bytes(range(8)))])])])
    as_json = json.loads(json_format.MessageToJson(req))
    # OTLP/JSON spells ids in hex, not protobuf's base64.
    record = as_json["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    record["traceId"], record["spanId"] = bytes(range(16)).hex(), bytes(range(8)).hex()
    from_json = decode("logs", json.dumps(as_json).encode(), "json")["logs"]
    from_proto = decode("logs", req.SerializeToString(), "protobuf")["logs"]
    assert from_json.to_pylist() == from_proto.to_pylist()
    assert from_json.column("trace_id")[0].as_py() == bytes(range(16)).hex()


def test_a_span_without_a_start_time_is_rejected() -> None:
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x"}]}]}]}).encode()
    with pytest.raises(DecodeError, match="no start time"):
        decode("traces", body, "json")


def test_an_empty_request_decodes_to_no_rows() -> None:
    assert decode("traces", b"", "protobuf")["spans"].num_rows == 0
    assert decode("metrics", b"{}", "json")["metric_points"].num_rows == 0

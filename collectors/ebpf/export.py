"""Measurements -> one OTLP/HTTP protobuf metrics request to the aiops server."""

from __future__ import annotations

import socket

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from aiops.auth import EBPF_SERVICE
from aiops.schema import NODE_ATTR
from collectors.ebpf.probes import BOUNDS_S, Measurement

__all__ = ["SCOPE", "SERVICE", "build_request", "send"]

SERVICE = EBPF_SERVICE  # the service its credential is bound to
SCOPE = "aiops.collectors.ebpf"
_DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def _kv(key: str, value: str | int) -> KeyValue:
    v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def build_request(measurements: list[Measurement], start_ns: int, end_ns: int,
                  version: str = "", node: str | None = None) -> ExportMetricsServiceRequest:
    """Delta points over [start_ns, end_ns]: one Metric per name, one point per attribute set."""
    metrics: dict[str, Metric] = {}
    for m in measurements:
        metric = metrics.get(m.name)
        if metric is None:
            metric = Metric(name=m.name, unit=m.unit or ("s" if m.is_histogram else "1"
                                                          if m.gauge else "{event}"))
            if m.is_histogram:
                metric.histogram.CopyFrom(Histogram(aggregation_temporality=_DELTA))
            elif m.gauge:
                metric.gauge.SetInParent()
            else:
                metric.sum.CopyFrom(Sum(aggregation_temporality=_DELTA, is_monotonic=True))
            metrics[m.name] = metric
        attrs = [_kv(k, v) for k, v in sorted(m.attributes.items())]
        if m.is_histogram:
            metric.histogram.data_points.append(HistogramDataPoint(
                attributes=attrs, start_time_unix_nano=start_ns, time_unix_nano=end_ns,
                count=m.count, sum=m.sum, bucket_counts=m.bucket_counts,
                explicit_bounds=BOUNDS_S))
        else:
            point = NumberDataPoint(attributes=attrs, start_time_unix_nano=start_ns,
                                    time_unix_nano=end_ns, as_double=m.value or 0.0)
            (metric.gauge if m.gauge else metric.sum).data_points.append(point)
    resource = Resource(attributes=[_kv("service.name", SERVICE),
                                    _kv("host.name", socket.gethostname()),
                                    *([_kv(NODE_ATTR, node)] if node else [])])
    return ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        resource=resource,
        scope_metrics=[ScopeMetrics(scope=InstrumentationScope(name=SCOPE, version=version),
                                    metrics=list(metrics.values()))])])


def send(client: httpx.Client, server_url: str, request: ExportMetricsServiceRequest) -> None:
    """POST to the server's OTLP receiver; raises httpx.HTTPError (the caller counts it)."""
    response = client.post(f"{server_url.rstrip('/')}/v1/metrics",
                           content=request.SerializeToString(),
                           headers={"Content-Type": "application/x-protobuf"})
    response.raise_for_status()

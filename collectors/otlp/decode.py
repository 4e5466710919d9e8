"""Decode OTLP/HTTP request bodies (protobuf or JSON) into Arrow tables of ``aiops.schema``.

JSON follows the OTLP/JSON mapping: ids are hex strings (protobuf's JSON mapping would read
them as base64, so they are rewritten before parsing), enums may be integers, 64-bit integers
may be strings. Every decoding failure becomes ``DecodeError`` with a message for the client.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from aiops.errors import DecodeError
from aiops.schema import LOGS, METRIC_POINTS, SPANS, Table

__all__ = ["SIGNALS", "Signal", "decode"]

_SPAN_KINDS = {0: None, 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_TEMPORALITY = {0: None, 1: "delta", 2: "cumulative"}
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def any_value(v: AnyValue) -> Any:
    """An OTLP AnyValue as a JSON-compatible Python value (bytes become base64)."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, which)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _json(obj: Any) -> str | None:
    return json.dumps(obj, separators=(",", ":")) if obj else None


def _ts(ns: int) -> int | None:
    return ns or None


def _hex(raw: bytes, size: int, what: str, *, optional: bool = False) -> str | None:
    if not raw and optional:
        return None
    if len(raw) != size:
        raise DecodeError(f"{what} must be {size} bytes, got {len(raw)}")
    return raw.hex()


def _resource_columns(resource: Any, scope: Any) -> dict[str, Any]:
    res = attributes(resource.attributes)
    return {
        "service_name": res.get("service.name"),
        "resource_attributes": _json(res),
        "scope_name": scope.name or None,
        "scope_version": scope.version or None,
    }


class _Columns:
    """Column lists for one table, filled row by row and turned into one Arrow table."""

    def __init__(self, t: Table) -> None:
        self.table = t
        self.data: dict[str, list[Any]] = {name: [] for name in t.column_names}

    def add(self, row: dict[str, Any]) -> None:
        for name, values in self.data.items():
            values.append(row.get(name))

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_pydict(self.data, schema=self.table.arrow_schema)


def _spans(req: ExportTraceServiceRequest) -> dict[str, pa.Table]:
    out = _Columns(SPANS)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            common = _resource_columns(rs.resource, ss.scope)
            for s in ss.spans:
                start, end = s.start_time_unix_nano, s.end_time_unix_nano
                if not start:
                    raise DecodeError(f"span {s.span_id.hex()} has no start time")
                out.add({
                    **common,
                    "trace_id": _hex(s.trace_id, 16, "trace_id"),
                    "span_id": _hex(s.span_id, 8, "span_id"),
                    "parent_span_id": _hex(s.parent_span_id, 8, "parent_span_id", optional=True),
                    "trace_state": s.trace_state or None,
                    "name": s.name,
                    "kind": _SPAN_KINDS.get(s.kind),
                    "start_time": start,
                    "end_time": _ts(end),
                    "duration_ns": end - start if end else None,
                    "status_code": _STATUS.get(s.status.code),
                    "status_message": s.status.message or None,
                    "attributes": _json(attributes(s.attributes)),
                    "events": _json([
                        {"time": e.time_unix_nano, "name": e.name,
                         "attributes": attributes(e.attributes)}
                        for e in s.events
                    ]),
                    "links": _json([
                        {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(),
                         "trace_state": ln.trace_state, "attributes": attributes(ln.attributes)}
                        for ln in s.links
                    ]),
                    "dropped_attributes_count": s.dropped_attributes_count,
                })
    return {SPANS.name: out.to_arrow()}


def _logs(req: ExportLogsServiceRequest) -> dict[str, pa.Table]:
    out = _Columns(LOGS)
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            common = _resource_columns(rl.resource, sl.scope)
            for r in sl.log_records:
                body = any_value(r.body)
                out.add({
                    **common,
                    "time": _ts(r.time_unix_nano or r.observed_time_unix_nano),
                    "observed_time": _ts(r.observed_time_unix_nano),
                    "trace_id": _hex(r.trace_id, 16, "trace_id", optional=True),
                    "span_id": _hex(r.span_id, 8, "span_id", optional=True),
                    "severity_number": r.severity_number or None,
                    "severity_text": r.severity_text or None,
                    "body": body if isinstance(body, str) or body is None else json.dumps(body),
                    "event_name": getattr(r, "event_name", "") or None,
                    "attributes": _json(attributes(r.attributes)),
                    "flags": r.flags,
                })
    return {LOGS.name: out.to_arrow()}


def _exemplars(points: Any) -> str | None:
    return _json([
        {"time": e.time_unix_nano,
         "value": e.as_double if e.WhichOneof("value") == "as_double" else e.as_int,
         "trace_id": e.trace_id.hex() or None, "span_id": e.span_id.hex() or None,
         "attributes": attributes(e.filtered_attributes)}
        for e in points
    ])


def _metrics(req: ExportMetricsServiceRequest) -> dict[str, pa.Table]:
    out = _Columns(METRIC_POINTS)
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            common = _resource_columns(rm.resource, sm.scope)
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                base = {**common, "name": m.name, "description": m.description or None,
                        "unit": m.unit or None, "type": kind}
                if kind in ("gauge", "sum"):
                    data = getattr(m, kind)
                    extra = {}
                    if kind == "sum":
                        extra = {"temporality": _TEMPORALITY.get(data.aggregation_temporality),
                                 "is_monotonic": data.is_monotonic}
                    for p in data.data_points:
                        which = p.WhichOneof("value")
                        out.add({**base, **extra, **_point(p),
                                 "value": float(getattr(p, which)) if which else None})
                elif kind == "histogram":
                    for p in m.histogram.data_points:
                        out.add({**base, **_point(p),
                                 "temporality": _TEMPORALITY.get(
                                     m.histogram.aggregation_temporality),
                                 "count": p.count,
                                 "sum": p.sum if p.HasField("sum") else None,
                                 "min": p.min if p.HasField("min") else None,
                                 "max": p.max if p.HasField("max") else None,
                                 "bucket_counts": list(p.bucket_counts),
                                 "explicit_bounds": list(p.explicit_bounds)})
                elif kind == "exponential_histogram":
                    eh = m.exponential_histogram
                    for p in eh.data_points:
                        out.add({**base, **_point(p),
                                 "temporality": _TEMPORALITY.get(eh.aggregation_temporality),
                                 "count": p.count,
                                 "sum": p.sum if p.HasField("sum") else None,
                                 "min": p.min if p.HasField("min") else None,
                                 "max": p.max if p.HasField("max") else None,
                                 "exp_histogram": json.dumps({
                                     "scale": p.scale, "zero_count": p.zero_count,
                                     "zero_threshold": p.zero_threshold,
                                     "positive": {"offset": p.positive.offset,
                                                  "bucket_counts": list(p.positive.bucket_counts)},
                                     "negative": {"offset": p.negative.offset,
                                                  "bucket_counts": list(p.negative.bucket_counts)},
                                 })})
                elif kind == "summary":
                    for p in m.summary.data_points:
                        out.add({**base, **_point(p), "count": p.count, "sum": p.sum,
                                 "quantiles": _json([
                                     {"quantile": q.quantile, "value": q.value}
                                     for q in p.quantile_values])})
                # A metric with no data (kind None) carries no points: nothing to store.
    return {METRIC_POINTS.name: out.to_arrow()}


def _point(p: Any) -> dict[str, Any]:
    if not p.time_unix_nano:
        raise DecodeError("metric data point has no time_unix_nano")
    return {
        "time": p.time_unix_nano,
        "start_time": _ts(p.start_time_unix_nano),
        "attributes": _json(attributes(p.attributes)),
        "exemplars": _exemplars(p.exemplars) if hasattr(p, "exemplars") else None,
    }


class Signal:
    """One OTLP signal: its request type and how it becomes tables."""

    def __init__(
        self, name: str, request: type[Message], convert: Callable[[Any], dict[str, pa.Table]]
    ) -> None:
        self.name = name
        self.request = request
        self.convert = convert


SIGNALS = {
    "traces": Signal("traces", ExportTraceServiceRequest, _spans),
    "logs": Signal("logs", ExportLogsServiceRequest, _logs),
    "metrics": Signal("metrics", ExportMetricsServiceRequest, _metrics),
}


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError as exc:
                    raise DecodeError(f"{k} must be a hex string, got {v[:40]!r}") from exc
            else:
                out[k] = _hex_ids_to_base64(v)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(x) for x in node]
    return node


def decode(signal: str, body: bytes, encoding: str) -> dict[str, pa.Table]:
    """Decode one request body of ``signal`` ('traces', 'logs', 'metrics').

    ``encoding`` is 'protobuf' or 'json'. Returns Arrow tables keyed by table name.
    """
    sig = SIGNALS[signal]
    msg = sig.request()
    if encoding == "protobuf":
        try:
            msg.ParseFromString(body)
        except (ProtobufDecodeError, RuntimeError, ValueError) as exc:
            raise DecodeError(f"body is not a valid OTLP {signal} protobuf message: {exc}") \
                from exc
    elif encoding == "json":
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise DecodeError("OTLP/JSON body must be a JSON object")
        try:
            json_format.ParseDict(_hex_ids_to_base64(doc), msg, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise DecodeError(f"body is not a valid OTLP {signal} JSON message: {exc}") from exc
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    try:
        return sig.convert(msg)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise DecodeError(f"OTLP {signal} request has out-of-range values: {exc}") from exc


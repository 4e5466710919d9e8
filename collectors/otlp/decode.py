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

import orjson
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

try:  # the compiled decoder (setup.py builds it); without it, the Python path below
    from collectors.otlp import _wire  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no C compiler was available
    _wire = None
from aiops.schema import LOGS, METRIC_POINTS, SPANS, Table
from collectors.otlp.derive import (
    DERIVED_SCHEMA,
    LOG_DERIVED_SCHEMA,
    STRINDEX,
    LogDerivation,
    SpanDerivation,
    with_derived,
)

__all__ = ["MAX_TIME_NS", "SIGNALS", "Decoded", "Signal", "decode"]

# Times are stored as DuckDB TIMESTAMP_NS (int64 nanoseconds since the epoch, which ends on
# 2262-04-11; its largest value means 'infinity'). OTLP times are fixed64, so a sender may
# send anything up to 2^64: a record with a time at or after 2262-01-01T00:00:00Z (a margin
# below the int64 end, for interval arithmetic in queries) is rejected rather than stored
# wrapped. A time of 0 means "not given" in OTLP. _wire.pyx holds the same bound.
MAX_TIME_NS = 9_214_646_400_000_000_000
_TIME_RANGE = "times must be below 2262-01-01T00:00:00Z"

_SPAN_KINDS = {0: None, 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_TEMPORALITY = {0: None, 1: "delta", 2: "cumulative"}
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def any_value(v: AnyValue) -> Any:
    """An OTLP AnyValue as a JSON-compatible Python value (bytes become base64)."""
    which = v.WhichOneof("value")
    if which is None or which == STRINDEX:
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


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _json(obj: Any) -> str | None:
    return _dumps(obj) if obj else None


def _attrs_json(kvs: Any) -> str | None:
    # The hot path: one dict and one orjson call per record, nothing when empty.
    if not kvs:
        return None
    return _dumps({kv.key: any_value(kv.value) for kv in kvs})


def _ts(ns: int) -> int | None:
    return ns or None


def _hex(raw: bytes, size: int, what: str, *, optional: bool = False) -> str | None:
    if not raw and optional:
        return None
    if len(raw) != size:
        raise DecodeError(f"{what} must be {size} bytes, got {len(raw)}")
    return raw.hex()


class Decoded(dict[str, pa.Table]):
    """Tables by name, plus the records rejected on the way (OTLP partial success)."""

    def __init__(self, tables: dict[str, pa.Table], rejected: int = 0,
                 message: str | None = None) -> None:
        super().__init__(tables)
        self.rejected = rejected
        self.message = message


class _Rejections:
    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None

    def add(self, message: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = message


_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def _span_ok(s: Any, rej: _Rejections) -> bool:
    # The same checks, in the same order and with the same messages, as _wire.decode_spans.
    tid, sid, pid = s.trace_id, s.span_id, s.parent_span_id
    start, end = s.start_time_unix_nano, s.end_time_unix_nano
    if len(tid) != 16:
        rej.add(f"trace_id must be 16 bytes, got {len(tid)}")
    elif len(sid) != 8:
        rej.add(f"span_id must be 8 bytes, got {len(sid)}")
    elif pid and len(pid) != 8:
        rej.add(f"parent_span_id must be 8 bytes, got {len(pid)}")
    elif tid == _ZERO_TRACE:
        rej.add(f"span {sid.hex()} has an all-zero trace_id (invalid in OTLP)")
    elif sid == _ZERO_SPAN:
        rej.add("span_id is all zeros (invalid in OTLP)")
    elif not start:
        rej.add(f"span {sid.hex()} has no start time")
    elif start >= MAX_TIME_NS:
        rej.add(f"span {sid.hex()} start_time_unix_nano {start} is out of range "
                f"({_TIME_RANGE})")
    elif end >= MAX_TIME_NS:
        rej.add(f"span {sid.hex()} end_time_unix_nano {end} is out of range ({_TIME_RANGE})")
    elif end and end < start:
        rej.add(f"span {sid.hex()} ends before it starts (end_time_unix_nano {end} < "
                f"start_time_unix_nano {start})")
    elif not 0 <= s.kind < 6:
        rej.add(f"span {sid.hex()} has unknown kind {s.kind} (SpanKind is 0-5)")
    elif any(e.time_unix_nano >= MAX_TIME_NS for e in s.events):
        rej.add(f"span {sid.hex()} has an event time out of range ({_TIME_RANGE})")
    else:
        return True
    return False


def _log_ok(r: Any, rej: _Rejections) -> bool:
    # The same checks, in the same order and with the same messages, as _wire.decode_logs.
    if r.trace_id and len(r.trace_id) != 16:
        rej.add(f"trace_id must be 16 bytes, got {len(r.trace_id)}")
    elif r.span_id and len(r.span_id) != 8:
        rej.add(f"span_id must be 8 bytes, got {len(r.span_id)}")
    elif r.time_unix_nano >= MAX_TIME_NS:
        rej.add(f"log record time_unix_nano {r.time_unix_nano} is out of range "
                f"({_TIME_RANGE})")
    elif r.observed_time_unix_nano >= MAX_TIME_NS:
        rej.add(f"log record observed_time_unix_nano {r.observed_time_unix_nano} is out of "
                f"range ({_TIME_RANGE})")
    else:
        return True
    return False


class _Columns:
    """Column lists for one table, turned into one Arrow table at the end."""

    def __init__(self, t: Table) -> None:
        self.table = t = t.wire
        self.data: dict[str, list[Any]] = {name: [] for name in t.column_names}

    def add(self, row: dict[str, Any]) -> None:
        for name, values in self.data.items():
            values.append(row.get(name))

    def fill(self, values: dict[str, Any], n: int) -> None:
        """Append ``n`` copies of per-resource/scope values (one list extend each)."""
        for name, value in values.items():
            self.data[name].extend([value] * n)

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_pydict(self.data, schema=self.table.arrow_schema)


def _resource_columns(resource: Any, scope: Any) -> dict[str, Any]:
    return _resource_values(attributes(resource.attributes), scope)


def _resource_values(res: dict[str, Any], scope: Any) -> dict[str, Any]:
    return {
        "service_name": res.get("service.name"),
        "resource_attributes": _json(res),
        "scope_name": scope.name or None,
        "scope_version": scope.version or None,
    }


_SPAN_KIND_NAMES = ("", "internal", "server", "client", "producer", "consumer")
_STATUS_NAMES = ("unset", "ok", "error")


def _spans(req: ExportTraceServiceRequest, rej: _Rejections) -> dict[str, pa.Table]:
    out = _Columns(SPANS)
    c = out.data
    trace_id, span_id, parent, state = c["trace_id"], c["span_id"], c["parent_span_id"], \
        c["trace_state"]
    name, kind, start_col, end_col, dur = c["name"], c["kind"], c["start_time"], \
        c["end_time"], c["duration_ns"]
    status_code, status_msg, attrs_col = c["status_code"], c["status_message"], c["attributes"]
    events_col, links_col, dropped = c["events"], c["links"], c["dropped_attributes_count"]
    derived = SpanDerivation()
    for rs in req.resource_spans:
        res = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            valid = [s for s in ss.spans if _span_ok(s, rej)]
            out.fill(_resource_values(res, ss.scope), len(valid))
            for s in valid:
                derived.add(res, s.attributes, s.status.code)
                tid, sid, pid = s.trace_id, s.span_id, s.parent_span_id
                start, end = s.start_time_unix_nano, s.end_time_unix_nano
                trace_id.append(tid.hex())
                span_id.append(sid.hex())
                parent.append(pid.hex() if pid else None)
                state.append(s.trace_state or None)
                name.append(s.name)
                k = s.kind
                kind.append(_SPAN_KIND_NAMES[k] or None)  # 0-5: _span_ok checked it
                start_col.append(start)
                end_col.append(end or None)
                dur.append(end - start if end else None)
                st = s.status
                code = st.code
                status_code.append(_STATUS_NAMES[code] if 0 <= code < 3 else None)
                status_msg.append(st.message or None)
                attrs_col.append(_attrs_json(s.attributes))
                events_col.append(_dumps([
                    {"time": e.time_unix_nano, "name": e.name,
                     "attributes": attributes(e.attributes)} for e in s.events])
                    if s.events else None)
                links_col.append(_dumps([
                    {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(),
                     "trace_state": ln.trace_state, "attributes": attributes(ln.attributes)}
                    for ln in s.links]) if s.links else None)
                dropped.append(s.dropped_attributes_count)
    columns = derived.columns()
    return {SPANS.name: out.to_arrow() if columns is None else with_derived({**c, **columns})}


def _logs(req: ExportLogsServiceRequest, rej: _Rejections) -> dict[str, pa.Table]:
    out = _Columns(LOGS)
    c = out.data
    derived = LogDerivation()
    for rl in req.resource_logs:
        res = attributes(rl.resource.attributes)
        for sl in rl.scope_logs:
            valid = [r for r in sl.log_records if _log_ok(r, rej)]
            out.fill(_resource_values(res, sl.scope), len(valid))
            for r in valid:
                derived.add(res, r.attributes)
                body = any_value(r.body)
                observed = r.observed_time_unix_nano
                c["time"].append(_ts(r.time_unix_nano or observed))
                c["observed_time"].append(_ts(observed))
                c["trace_id"].append(_hex(r.trace_id, 16, "trace_id", optional=True))
                c["span_id"].append(_hex(r.span_id, 8, "span_id", optional=True))
                c["severity_number"].append(r.severity_number or None)
                c["severity_text"].append(r.severity_text or None)
                c["body"].append(body if isinstance(body, str) or body is None
                                 else _dumps(body))
                c["event_name"].append(getattr(r, "event_name", "") or None)
                c["attributes"].append(_attrs_json(r.attributes))
                c["flags"].append(r.flags)
    columns = derived.columns()
    return {LOGS.name: out.to_arrow() if columns is None
            else with_derived({**c, **columns}, LOG_DERIVED_SCHEMA)}


def _exemplars(points: Any) -> str | None:
    return _json([
        {"time": e.time_unix_nano,
         "value": e.as_double if e.WhichOneof("value") == "as_double" else e.as_int,
         "trace_id": e.trace_id.hex() or None, "span_id": e.span_id.hex() or None,
         "attributes": attributes(e.filtered_attributes)}
        for e in points
    ])


def _metrics(req: ExportMetricsServiceRequest, rej: _Rejections) -> dict[str, pa.Table]:
    out = _Checked(METRIC_POINTS, rej)
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
    return {
        "time": p.time_unix_nano,
        "start_time": _ts(p.start_time_unix_nano),
        "attributes": _json(attributes(p.attributes)),
        "exemplars": _exemplars(p.exemplars) if hasattr(p, "exemplars") else None,
    }


class _Checked(_Columns):
    """Metric point columns that reject points without a time instead of storing them."""

    def __init__(self, t: Table, rej: _Rejections) -> None:
        super().__init__(t)
        self.rej = rej

    def add(self, row: dict[str, Any]) -> None:
        time, start = row.get("time"), row.get("start_time")
        if not time:
            self.rej.add(f"data point of {row.get('name')} has no time_unix_nano")
            return
        if time >= MAX_TIME_NS or (start or 0) >= MAX_TIME_NS:
            self.rej.add(f"data point of {row.get('name')} has a time out of range "
                         f"({_TIME_RANGE})")
            return
        super().add(row)


class Signal:
    """One OTLP signal: its request type and how it becomes tables."""

    def __init__(
        self, name: str, request: type[Message],
        convert: Callable[[Any, _Rejections], dict[str, pa.Table]]
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


def _decode_compiled(signal: str, body: bytes) -> Decoded | None:
    """The compiled decoder's result, or None for a body it leaves to the Python path (a
    singular message field given twice, which protobuf merges)."""
    t = (SPANS if signal == "traces" else LOGS).wire
    try:
        if signal == "traces":
            arrays, rejected, first, skipped = _wire.decode_spans(body, t.arrow_schema,
                                                                  DERIVED_SCHEMA)
        else:
            arrays, rejected, first, skipped = _wire.decode_logs(body, t.arrow_schema,
                                                                 LOG_DERIVED_SCHEMA)
    except _wire.NonCanonical:
        return None
    except _wire.WireError as exc:
        raise DecodeError(f"body is not a valid OTLP {signal} protobuf message: {exc}") \
            from exc
    except RecursionError as exc:
        raise DecodeError(f"OTLP {signal} request nests values too deeply") from exc
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        # A value the columns cannot hold (a list as service.name) stops this decoder where
        # protobuf reads on: a body that is also malformed further on is refused as such, as
        # the Python path refuses it (found by fuzz/fuzz_decode.py).
        _protobuf_check(signal, body)
        raise DecodeError(f"OTLP {signal} request has out-of-range values: {exc}") from exc
    # The derived columns come only where every record's were certain (collectors/otlp/derive).
    derived = DERIVED_SCHEMA if signal == "traces" else LOG_DERIVED_SCHEMA
    schema = derived if derived.names[-1] in arrays else t.arrow_schema
    try:
        table = pa.Table.from_arrays([arrays[n] for n in schema.names], schema=schema)
        table.validate()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        _protobuf_check(signal, body)  # as above
        raise DecodeError(f"OTLP {signal} request has out-of-range values: {exc}") from exc
    if rejected or skipped:
        # The compiled decoder stops reading a record at its first fault, and skips the
        # fields it does not store; protobuf (upb, C) parses all of it (UTF-8 of every string,
        # the structure of every message), and the Python path refuses a body it calls
        # malformed anywhere: so must this one (fuzz/fuzz_decode.py found both). Only bodies
        # with rejected records or skipped length-delimited fields pay for the check; SDK
        # exports have neither (their schema_url fields are checked, not skipped).
        _protobuf_check(signal, body)
    if rejected and not table.num_rows:
        raise DecodeError(f"every record was rejected ({rejected}): {first}")
    return Decoded({t.name: table}, rejected, first)


def _protobuf_check(signal: str, body: bytes) -> None:
    try:
        SIGNALS[signal].request().ParseFromString(body)
    except (ProtobufDecodeError, RuntimeError, ValueError) as exc:
        raise DecodeError(f"body is not a valid OTLP {signal} protobuf message: {exc}") \
            from exc


def decode(signal: str, body: bytes, encoding: str, *, compiled: bool = True) -> Decoded:
    """Decode one request body of ``signal`` ('traces', 'logs', 'metrics').

    ``encoding`` is 'protobuf' or 'json'. Protobuf traces and logs go through the compiled
    decoder when it is built (``compiled=False`` forces the Python path, which the equivalence
    tests compare it with). Returns Arrow tables keyed by table name; invalid
    records (bad or all-zero ids, no time, a time at or after ``MAX_TIME_NS``, a span that
    ends before it starts or has an unknown kind) are left out and counted in ``rejected``
    (OTLP partial success), with the first reason in ``message``.
    A body that is malformed as a whole, or whose every record is invalid, is a DecodeError.
    """
    if compiled and _wire is not None and encoding == "protobuf" and signal != "metrics":
        done = _decode_compiled(signal, body)
        if done is not None:
            return done
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
            doc = orjson.loads(body)  # also bounds nesting depth (1024)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise DecodeError("OTLP/JSON body must be a JSON object")
        try:
            json_format.ParseDict(_hex_ids_to_base64(doc), msg, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise DecodeError(f"body is not a valid OTLP {signal} JSON message: {exc}") from exc
        except RecursionError as exc:
            raise DecodeError("OTLP/JSON body is nested too deeply") from exc
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    rej = _Rejections()
    try:
        tables = sig.convert(msg, rej)
    except RecursionError as exc:
        raise DecodeError(f"OTLP {signal} request nests values too deeply") from exc
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise DecodeError(f"OTLP {signal} request has out-of-range values: {exc}") from exc
    if rej.count and not any(t.num_rows for t in tables.values()):
        raise DecodeError(f"every record was rejected ({rej.count}): {rej.first}")
    return Decoded(tables, rej.count, rej.first)


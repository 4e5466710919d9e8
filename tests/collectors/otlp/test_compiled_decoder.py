"""The compiled decoder (collectors/otlp/_wire.pyx) gives exactly what the Python path gives,
for any traces and logs request; it is what serves protobuf traffic when built."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from aiops.errors import DecodeError
from collectors.otlp import decode as decode_module
from collectors.otlp import derive
from collectors.otlp.decode import decode
from tests.collectors.otlp.test_decode import derived_requests

if decode_module._wire is None and os.environ.get("AIOPS_REQUIRE_COMPILED"):
    raise RuntimeError("`make test` expects the compiled decoder (setup.py builds it)")
pytestmark = pytest.mark.skipif(decode_module._wire is None,
                                reason="the compiled decoder is not built here")

JSON_COLUMNS = {"attributes", "resource_attributes", "events", "links"}
PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

text = st.text(max_size=12)
scalars = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), text),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-2**63, 2**63 - 1)),
    st.builds(lambda f: AnyValue(double_value=f), st.floats(allow_nan=False,
                                                            allow_infinity=False)),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=8)),
    st.just(AnyValue()),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)),
              st.lists(inner, max_size=3)),
    st.builds(lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key=k, value=v) for k, v in kvs.items()])),
        st.dictionaries(text, inner, max_size=3))), max_leaves=8)
attribute_lists = st.dictionaries(text, values, max_size=4).map(
    lambda d: [KeyValue(key=k, value=v) for k, v in d.items()])
ids16 = st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=3))
ids8 = st.one_of(st.binary(min_size=8, max_size=8), st.just(b""), st.binary(max_size=3))
times = st.integers(0, 2**62)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    start = draw(times)
    return Span(
        trace_id=draw(ids16), span_id=draw(st.binary(min_size=8, max_size=8)),
        parent_span_id=draw(ids8), trace_state=draw(text), name=draw(text),
        kind=draw(st.integers(0, 7)), start_time_unix_nano=start,
        end_time_unix_nano=draw(st.one_of(st.just(0), st.integers(start, start + 2**40))),
        attributes=draw(attribute_lists), dropped_attributes_count=draw(st.integers(0, 9)),
        events=[Span.Event(time_unix_nano=draw(times), name=draw(text),
                           attributes=draw(attribute_lists))
                for _ in range(draw(st.integers(0, 2)))],
        links=[Span.Link(trace_id=draw(st.binary(max_size=16)),
                         span_id=draw(st.binary(max_size=8)), trace_state=draw(text),
                         attributes=draw(attribute_lists))
               for _ in range(draw(st.integers(0, 2)))],
        status=Status(code=draw(st.integers(0, 4)), message=draw(text)))


@st.composite
def logs(draw: st.DrawFn) -> LogRecord:
    return LogRecord(
        time_unix_nano=draw(times), observed_time_unix_nano=draw(times),
        severity_number=draw(st.integers(0, 24)), severity_text=draw(text),
        body=draw(values), attributes=draw(attribute_lists), flags=draw(st.integers(0, 255)),
        trace_id=draw(st.one_of(st.just(b""), ids16)), span_id=draw(ids8),
        event_name=draw(text))


def resource(draw: st.DrawFn) -> Resource:
    return Resource(attributes=draw(attribute_lists))


def scope(draw: st.DrawFn) -> InstrumentationScope:
    return InstrumentationScope(name=draw(text), version=draw(text))


@st.composite
def trace_requests(draw: st.DrawFn) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource=resource(draw), scope_spans=[
            ScopeSpans(scope=scope(draw), spans=draw(st.lists(spans(), max_size=4)))
            for _ in range(draw(st.integers(0, 2)))])
        for _ in range(draw(st.integers(0, 2)))]).SerializeToString()


@st.composite
def log_requests(draw: st.DrawFn) -> bytes:
    return ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(resource=resource(draw), scope_logs=[
            ScopeLogs(scope=scope(draw), log_records=draw(st.lists(logs(), max_size=4)))
            for _ in range(draw(st.integers(0, 2)))])
        for _ in range(draw(st.integers(0, 2)))]).SerializeToString()


def comparable(table: pa.Table) -> list[dict[str, Any]]:
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.int64()))
    rows = table.to_pylist()
    out = []
    for row in rows:
        for k, v in row.items():
            if k in JSON_COLUMNS and v is not None:
                row[k] = json.loads(v)
            elif k == "body" and isinstance(v, str) and v[:1] in "[{" and v[-1:] in "]}":
                with contextlib.suppress(ValueError):  # a string body that only looks like JSON
                    row[k] = json.loads(v)
        out.append(row)
    return out


def outcome(signal: str, body: bytes, compiled: bool) -> Any:
    try:
        result = decode(signal, body, "protobuf", compiled=compiled)
    except DecodeError as exc:
        return ("error", str(exc).split(":")[0])
    return (result.rejected, result.message,
            {name: comparable(t) for name, t in result.items()})


@PROPERTY
@given(body=trace_requests())
def test_traces_decode_identically(body: bytes) -> None:
    assert outcome("traces", body, True) == outcome("traces", body, False)


@PROPERTY
@given(body=log_requests())
# Found by this test: a double body of 2^-14 was 6.103515625e-05 (Python's repr) compiled and
# 0.00006103515625 (orjson's form) through the Python path.
@example(body=b"\n-\n\x00\x12)\n\x00\x12\x0e*\x02\n\x00R\x08\x00\x00\x00\x00\x00\x00\x00"
         b"\x00\x12\x15*\t!\x00\x00\x00\x00\x00\x00\x10?R\x08\x00\x00\x00\x00\x00\x00\x00\x00")
def test_logs_decode_identically(body: bytes) -> None:
    assert outcome("logs", body, True) == outcome("logs", body, False)


@settings(max_examples=300, deadline=None)
@given(value=st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e-5, -1.5e-5, 9.99e-6, 1e-7, 1e15, 1e16, 1.5e16, 1e21, 5e-324, -0.0]))
def test_a_double_is_written_as_orjson_writes_it(value: float) -> None:
    """The compiled decoder's JSON of a double (a log body, an attribute) is the Python
    path's: orjson's decimal range and unpadded exponents, not Python's repr."""
    record = LogRecord(body=AnyValue(double_value=value), attributes=[
        KeyValue(key="x", value=AnyValue(double_value=value))])
    body = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[
        ScopeLogs(log_records=[record])])]).SerializeToString()
    assert outcome("logs", body, True) == outcome("logs", body, False)


@PROPERTY
@given(body=derived_requests())
def test_traces_with_the_keys_of_the_derived_columns_decode_identically(body: bytes) -> None:
    # The derived columns included: both derive them, or both leave them to the store.
    assert outcome("traces", body, True) == outcome("traces", body, False)


def test_the_compiled_decoder_reads_the_keys_the_python_path_reads() -> None:
    assert decode_module._wire.SPAN_KEYS == derive.SPAN_KEYS
    assert decode_module._wire.RESOURCE_KEYS == derive.RESOURCE_KEYS


@pytest.mark.parametrize("body", [b"\x0a\x05\x12\x03\x12\x01\xff",  # bad UTF-8 in a name
                                  b"\x0a\xff", b"\x0b", b"\x0a\x02\x12\x09"])
def test_malformed_bodies_are_decode_errors_in_both(body: bytes) -> None:
    for compiled in (True, False):
        with pytest.raises(DecodeError):
            decode("traces", body, "protobuf", compiled=compiled)


def _odd_service(value: AnyValue, signal: str) -> bytes:
    resource = Resource(attributes=[KeyValue(key="service.name", value=value)])
    if signal == "logs":
        return ExportLogsServiceRequest(resource_logs=[ResourceLogs(
            resource=resource, scope_logs=[ScopeLogs(log_records=[LogRecord(
                time_unix_nano=1_700_000_000_000_000_000,
                body=AnyValue(string_value="x"))])])]).SerializeToString()
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(spans=[Span(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s",
            start_time_unix_nano=1_700_000_000_000_000_000,
            end_time_unix_nano=1_700_000_000_000_000_001)])])]).SerializeToString()


# Found by test_logs_decode_identically: a service.name that is no string made the compiled
# path raise AttributeError (a 500) where the Python path refuses the request (a 400).
@pytest.mark.parametrize("signal", ["traces", "logs"])
@pytest.mark.parametrize("value", [
    AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")])),
    AnyValue(int_value=5), AnyValue(bool_value=True)], ids=["array", "int", "bool"])
def test_a_service_name_that_is_no_string_is_a_decode_error_in_both(
        signal: str, value: AnyValue) -> None:
    body = _odd_service(value, signal)
    assert outcome(signal, body, True) == outcome(signal, body, False)
    assert outcome(signal, body, True)[0] == "error"


def test_an_odd_service_name_with_no_records_is_no_error_in_either() -> None:
    body = b"\n\x1a\n\x14\n\x12\n\x0cservice.name\x12\x02*\x00\x12\x02\n\x00"
    assert outcome("logs", body, True) == outcome("logs", body, False)


FINDINGS = sorted((Path(__file__).parent / "fuzz_findings").iterdir())


@pytest.mark.parametrize("finding", FINDINGS, ids=[f.name for f in FINDINGS])
@pytest.mark.parametrize("signal", ["traces", "logs"])
def test_what_fuzzing_found_decodes_the_same_both_ways(finding: Path, signal: str) -> None:
    """Inputs where the decoders disagreed, found by fuzz/fuzz_decode.py (a key with field
    number 0, inside a group or not; a proto2 group in an unknown field; a rejected record
    whose unread rest protobuf refuses; a skipped field protobuf calls malformed; varints past
    64 bits; enums past 32 bits), and the same classes written out by hand for each field
    they concern (docs/security.md lists them): protobuf's merge of a message field given
    twice, strings in skipped or replaced fields that are not UTF-8, overlong keys."""
    body = finding.read_bytes()
    assert outcome(signal, body, True) == outcome(signal, body, False)


def test_sdk_exports_with_schema_urls_are_not_parsed_twice(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A body whose fields the compiled decoder skipped unread is parsed by protobuf too (what
    it holds may be malformed); an SDK's export, schema URLs on its resource and scope
    included, has none, so it is decoded once."""
    schema = "https://opentelemetry.io/schemas/1.26.0"
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="op", kind=2,
                start_time_unix_nano=10**18, end_time_unix_nano=10**18 + 5,
                attributes=[KeyValue(key="k", value=AnyValue(string_value="v"))])
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=[KeyValue(key="service.name",
                                               value=AnyValue(string_value="svc"))]),
        schema_url=schema, scope_spans=[ScopeSpans(
            scope=InstrumentationScope(name="s", version="1"), schema_url=schema,
            spans=[span])])]).SerializeToString()
    checked: list[str] = []
    real_check = decode_module._protobuf_check
    monkeypatch.setattr(decode_module, "_protobuf_check",
                        lambda signal, b: (checked.append(signal), real_check(signal, b)))
    assert decode("traces", body, "protobuf").rejected == 0 and checked == []
    # The same body with a field the decoder does not read (scope attributes) is checked.
    scoped = ExportTraceServiceRequest.FromString(body)
    scoped.resource_spans[0].scope_spans[0].scope.attributes.append(
        KeyValue(key="a", value=AnyValue(int_value=1)))
    decode("traces", scoped.SerializeToString(), "protobuf")
    assert checked == ["traces"]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_profiles_string_index_is_null_and_replaces_what_came_before(compiled: bool) -> None:
    """AnyValue's ``string_value_strindex`` points into a profiles dictionary that no trace
    carries: a member of the value's oneof all the same (found by fuzzing: the compiled
    decoder skipped it and kept the double before it), so the value reads as null, and the
    derived columns read it as SQL's ``->>`` reads a JSON null."""
    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field, by hand
        return bytes([number << 3 | 2]) + _VarintBytes(len(payload)) + payload

    # Serialized by hand: protobuf's own message would keep only the oneof's last member.
    replaced = AnyValue(double_value=1.5).SerializeToString() + \
        AnyValue(string_value_strindex=7).SerializeToString()
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="op", kind=2,
                start_time_unix_nano=10**18, end_time_unix_nano=10**18 + 5,
                attributes=[KeyValue(key="gen_ai.request.model",
                                     value=AnyValue(string_value_strindex=3))])
    span_bytes = span.SerializeToString() + field(9, KeyValue(key="x").SerializeToString()
                                                  + field(2, replaced))
    resource = Resource(attributes=[KeyValue(key="service.name",
                                             value=AnyValue(string_value="chat"))])
    body = field(1, field(1, resource.SerializeToString()) + field(2, field(2, span_bytes)))
    spans = decode("traces", body, "protobuf", compiled=compiled)["spans"]
    [row] = spans.select(["attributes", "model"]).to_pylist()
    assert json.loads(row["attributes"]) == {"gen_ai.request.model": None, "x": None}
    assert row["model"] is None

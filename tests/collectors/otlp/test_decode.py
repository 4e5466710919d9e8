"""OTLP decoding keeps every kind of record, in both encodings."""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
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
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from aiops import identity, semconv
from aiops.errors import DecodeError
from aiops.schema import LOGS, SPANS, Table
from aiops.store import Store
from aiops.store_conform import decoder_derived, without_derived
from collectors.otlp import decode as decode_module
from collectors.otlp.decode import decode
from collectors.otlp.derive import RESOURCE_KEYS, SPAN_KEYS
from collectors.otlp.writer import BatchWriter

T = 1_700_000_000_000_000_000
DECODERS = [pytest.param(False, id="python"), pytest.param(True, id="compiled", marks=(
    pytest.mark.skipif(decode_module._wire is None, reason="compiled decoder not built")))]
DERIVED = [d.name for d in SPANS.derived]
LOG_DERIVED = [d.name for d in LOGS.derived]


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


# -- The typed spans columns, derived by the decoder where certain, else by the store's SQL --

def _s(text: str) -> AnyValue:
    return AnyValue(string_value=text)


def _i(value: int) -> AnyValue:
    return AnyValue(int_value=value)


texts = st.text(max_size=8)  # any code point: NUL, controls, quotes, backslashes, CJK
ints = st.one_of(st.sampled_from([0, 200, 404, 499, 500, 503, -1, 2**31 - 1, 2**31, -2**31,
                                  -2**31 - 1, 2**63 - 1, -2**63]),
                 st.integers(-2**63, 2**63 - 1))
digit_strings = st.one_of(st.from_regex(r"\A[0-9]{1,12}\Z"), st.sampled_from(
    ["0", "503", "0000000503", "2147483647", "2147483648", "4294967796", "9999999999"]))
number_strings = st.one_of(
    st.from_regex(r"\A[ +-]?[0-9]{0,11}(\.[0-9]{0,2})?(e[0-9])? ?\Z"),
    st.sampled_from(["", " 200", "+500", "5.5", "500.5", "1e3", "0x1F", "\u0663", "1_000",
                     "0500", "0000000000503", "2147483647", "2147483648", "-2147483648",
                     "\uff15\uff10\uff10", "502\x00"]))
# What derive.py derives itself: strings for the text keys; ints and digit strings for status.
tame_text = st.one_of(texts.map(_s), st.just(AnyValue()))
edges = st.sampled_from([499, 500, 2**31 - 1, 2**31, -2**31, -2**31 - 1])
tame_status = st.one_of(edges.map(_i), edges.map(str).filter(str.isdigit).map(_s),
                        ints.map(_i), digit_strings.map(_s), st.just(AnyValue()))
# And what it must leave to SQL, or gets right only by being careful.
anything = st.one_of(
    texts.map(_s), number_strings.map(_s), digit_strings.map(_s), ints.map(_i),
    st.just(AnyValue()),
    st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.binary(max_size=4).map(lambda b: AnyValue(bytes_value=b)),
    st.lists(ints.map(_i), max_size=2).map(
        lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
    st.dictionaries(texts, number_strings.map(_s), max_size=2).map(
        lambda d: AnyValue(kvlist_value=KeyValueList(values=[
            KeyValue(key=k, value=v) for k, v in d.items()]))))
# Near misses of the keys, which must be ignored.
other_keys = st.sampled_from(["gen_ai.request.model2", "http.status_cod", "http.status_codf",
                              "aiops.model.versioN", "gen_ai.request.mode", "inference_id"])


# Ways a request's attributes are drawn: only values the decoder derives (each key once);
# numbers of every spelling and type for the status keys (each key once); anything at all.
TAME, NUMBERS, WILD = "tame", "numbers", "wild"
numbers = st.one_of(tame_status, number_strings.map(_s),
                    st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
                    st.booleans().map(lambda b: AnyValue(bool_value=b)))


@st.composite
def _attributes(draw: st.DrawFn, keys: tuple[str, ...], mode: str,
                status_keys: frozenset[str] = frozenset()) -> list[KeyValue]:
    if mode == WILD:
        pairs = draw(st.lists(st.tuples(st.one_of(st.sampled_from(keys), other_keys),
                                        anything), max_size=5))
        return [KeyValue(key=k, value=v) for k, v in pairs]
    chosen = draw(st.lists(st.one_of(st.sampled_from(keys), other_keys), unique=True))
    status = tame_status if mode == TAME else numbers
    return [KeyValue(key=k, value=draw(tame_text if k in keys and k not in status_keys
                                       else status)) for k in chosen]


@st.composite
def derived_requests(draw: st.DrawFn) -> bytes:
    """Trace requests whose spans and resources carry the keys the derived columns read, with
    values of every type; many of them only with values the decoder derives itself."""
    mode = draw(st.sampled_from([TAME, NUMBERS, WILD]))
    status = frozenset(SPAN_KEYS[2:])

    def one_span() -> Span:
        return Span(trace_id=secrets.token_bytes(16), span_id=secrets.token_bytes(8),
                    name="op", start_time_unix_nano=T, end_time_unix_nano=T + 1,
                    status=Status(code=draw(st.integers(0, 4))),  # type: ignore[arg-type]
                    attributes=draw(_attributes(SPAN_KEYS, mode, status)))

    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=draw(_attributes(RESOURCE_KEYS, mode))),
        scope_spans=[ScopeSpans(spans=[one_span() for _ in range(draw(st.integers(1, 3)))])
                     for _ in range(draw(st.integers(1, 2)))])
        for _ in range(draw(st.integers(1, 2)))]).SerializeToString()


@st.composite
def derived_log_requests(draw: st.DrawFn) -> bytes:
    """Log requests whose records and resources carry the keys the derived columns read (and
    the spans' status keys, which logs do not read), with values of every type."""
    mode = draw(st.sampled_from([TAME, NUMBERS, WILD]))

    def one_record() -> LogRecord:
        return LogRecord(time_unix_nano=T, body=AnyValue(string_value="hello"),
                         attributes=draw(_attributes(SPAN_KEYS, mode,
                                                     frozenset(SPAN_KEYS[2:]))))

    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=draw(_attributes(RESOURCE_KEYS, mode))),
        scope_logs=[ScopeLogs(log_records=[one_record()
                                           for _ in range(draw(st.integers(1, 3)))])
                    for _ in range(draw(st.integers(1, 2)))])
        for _ in range(draw(st.integers(1, 2)))]).SerializeToString()


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(tmp_path_factory.mktemp("derive") / "t.duckdb")
    yield s
    s.close()


_TAGS = itertools.count()


def _stored_derived(store: Store, rows: pa.Table, t: Table = SPANS) -> list[tuple[Any, ...]]:
    """The derived columns the store holds for ``rows`` of ``t`` once appended (its rows told
    apart from other examples' by the credential column)."""
    tag = f"example-{next(_TAGS)}"
    store.append(t.name, rows.append_column(
        "ingest_credential", pa.array([tag] * rows.num_rows, pa.string())))
    return store.query(f"SELECT {', '.join(d.name for d in t.derived)} FROM {t.name} "
                       "WHERE ingest_credential = ? ORDER BY rowid", [tag]).rows


# 100 examples a decoder (each stores its rows twice, ~70 ms): the edge cases below are fixed.
@pytest.mark.parametrize("compiled", DECODERS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=derived_requests())
def test_the_columns_a_decoder_derives_are_those_the_store_derives_in_sql(
        shared_store: Store, compiled: bool, body: bytes) -> None:
    spans = decode("traces", body, "protobuf", compiled=compiled)["spans"]
    as_decoded = _stored_derived(shared_store, spans)
    in_sql = _stored_derived(shared_store, without_derived(SPANS, spans))
    assert as_decoded == in_sql
    if decoder_derived(SPANS, spans):  # and what the decoder derived is what was stored
        assert as_decoded == [tuple(r.values()) for r in spans.select(DERIVED).to_pylist()]


@pytest.mark.parametrize("compiled", DECODERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=derived_log_requests())
def test_the_log_columns_a_decoder_derives_are_those_the_store_derives_in_sql(
        shared_store: Store, compiled: bool, body: bytes) -> None:
    logs = decode("logs", body, "protobuf", compiled=compiled)["logs"]
    as_decoded = _stored_derived(shared_store, logs, LOGS)
    assert as_decoded == _stored_derived(shared_store, without_derived(LOGS, logs), LOGS)
    if decoder_derived(LOGS, logs):
        assert as_decoded == [tuple(r.values()) for r in logs.select(LOG_DERIVED).to_pylist()]


@pytest.mark.parametrize("compiled", DECODERS)
def test_the_usual_log_record_gets_its_columns_from_the_decoder(compiled: bool) -> None:
    """An SDK's records (string attributes, a Serve replica's resource) are derived while
    decoding, by both decoders alike: the store parses no JSON for them."""
    body = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=_kvs({
            semconv.SERVICE_VERSION_ATTR: _s("v2"), semconv.REPLICA_ATTR: _s("r1"),
            identity.DEPLOYMENT: _s("Scorer"), identity.APP: _s("shop")})),
        scope_logs=[ScopeLogs(log_records=[
            LogRecord(time_unix_nano=T, body=_s("a"),
                      attributes=_kvs({semconv.MODEL_ATTR: _s("chat")})),
            LogRecord(time_unix_nano=T, body=_s("b"), attributes=_kvs({
                semconv.MODEL_VERSION_ATTR: _s("v3"), semconv.HTTP_STATUS_ATTR: _i(500)}))])])]
    ).SerializeToString()
    logs = decode("logs", body, "protobuf", compiled=compiled)["logs"]
    assert decoder_derived(LOGS, logs)
    assert logs.select(LOG_DERIVED).to_pylist() == [
        {"model": "chat", "model_version": "v2", "replica": "r1", "deployment": "Scorer",
         "app": "shop"},
        {"model": None, "model_version": "v3", "replica": "r1", "deployment": "Scorer",
         "app": "shop"}]


Pairs = dict[str, AnyValue] | list[tuple[str, AnyValue]]


def _kvs(pairs: Pairs) -> list[KeyValue]:
    return [KeyValue(key=k, value=v) for k, v in (
        pairs.items() if isinstance(pairs, dict) else pairs)]


def _one_span(attributes: Pairs, resource: Pairs | None = None, code: int = 0) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=_kvs(resource or {})),
        scope_spans=[ScopeSpans(spans=[Span(
            trace_id=secrets.token_bytes(16), span_id=secrets.token_bytes(8), name="op",
            start_time_unix_nano=T, end_time_unix_nano=T + 1,
            status=Status(code=code),  # type: ignore[arg-type]
            attributes=_kvs(attributes))])])]).SerializeToString()


NEW, OLD = semconv.HTTP_STATUS_ATTR, semconv.OLD_HTTP_STATUS_ATTR
EDGES: list[tuple[Pairs, Pairs]] = [
    ({NEW: _i(-2**31), OLD: _i(200)}, {}),
    ({NEW: _i(-2**31 - 1), OLD: _i(500)}, {}),
    ({NEW: _i(2**31 - 1)}, {}),
    ({NEW: _i(2**31), OLD: _s("499")}, {}),
    ({NEW: _s("2147483647"), OLD: _i(1)}, {}),
    ({NEW: _s("2147483648"), OLD: _i(503)}, {}),
    ({NEW: _s(" 503"), OLD: _i(200)}, {}),
    ({NEW: _s("abc"), OLD: _s("0500")}, {}),
    ({NEW: AnyValue(), OLD: _s("500")}, {}),
    ([(NEW, _i(200)), (NEW, _i(500))], {}),
    ([(semconv.MODEL_ATTR, _s("a")), (semconv.MODEL_ATTR, _s("b"))], {}),
    ({semconv.MODEL_ATTR: _s(""), semconv.MODEL_VERSION_ATTR: _s("")},
     {semconv.SERVICE_VERSION_ATTR: _s("r")}),
    ({semconv.MODEL_ATTR: _s('\x00"\\\u6a21\n')}, {semconv.REPLICA_ATTR: _s("")}),
    ({semconv.MODEL_VERSION_ATTR: AnyValue()},
     [(semconv.SERVICE_VERSION_ATTR, _s("a")), (semconv.SERVICE_VERSION_ATTR, _s("b"))]),
    ({}, {semconv.SERVICE_VERSION_ATTR: AnyValue(bytes_value=b"\xff"),
          semconv.REPLICA_ATTR: AnyValue(double_value=1.0)}),
    ({"http.status_codf": _i(500), "gen_ai.request.modex": _s("m")}, {}),
]


@pytest.mark.parametrize("compiled", DECODERS)
@pytest.mark.parametrize(("attributes", "resource"), EDGES)
def test_on_edge_values_a_decoder_derives_what_the_store_derives_in_sql(
        shared_store: Store, compiled: bool, attributes: Pairs, resource: Pairs) -> None:
    for code in (0, 2):
        spans = decode("traces", _one_span(attributes, resource, code), "protobuf",
                       compiled=compiled)["spans"]
        assert _stored_derived(shared_store, spans) == _stored_derived(
            shared_store, without_derived(SPANS, spans))


@pytest.mark.parametrize("compiled", DECODERS)
def test_the_usual_span_gets_its_columns_from_the_decoder(compiled: bool) -> None:
    body = _one_span({semconv.MODEL_ATTR: _s("chat"), semconv.HTTP_STATUS_ATTR: _s("x"),
                      semconv.OLD_HTTP_STATUS_ATTR: _i(200)},
                     {semconv.SERVICE_VERSION_ATTR: _s("v2"), semconv.REPLICA_ATTR: _s("r1")})
    assert not decoder_derived(SPANS, decode("traces", body, "protobuf", compiled=compiled)[
        "spans"])  # "x" is for the SQL to read
    body = _one_span({semconv.MODEL_ATTR: _s("chat"), semconv.HTTP_STATUS_ATTR: _i(2**40),
                      semconv.OLD_HTTP_STATUS_ATTR: _s("503")},
                     {semconv.SERVICE_VERSION_ATTR: _s("v2"), semconv.REPLICA_ATTR: _s("r1"),
                      identity.DEPLOYMENT: _s("Scorer"), identity.APP: _s("shop")})
    spans = decode("traces", body, "protobuf", compiled=compiled)["spans"]
    assert decoder_derived(SPANS, spans)
    assert spans.select(DERIVED).to_pylist() == [
        {"model": "chat", "model_version": "v2", "replica": "r1", "http_status": 503,
         "failed": True, "deployment": "Scorer", "app": "shop"}]


@pytest.mark.parametrize("compiled", DECODERS)
@pytest.mark.parametrize("attributes", [
    {semconv.HTTP_STATUS_ATTR: AnyValue(double_value=503.0)},
    {semconv.HTTP_STATUS_ATTR: _s(" 503")},
    {semconv.OLD_HTTP_STATUS_ATTR: _s("2147483648")},
    {semconv.MODEL_ATTR: AnyValue(bool_value=True)},
    {semconv.MODEL_ATTR: _i(7)},
    {semconv.MODEL_VERSION_ATTR: AnyValue(bytes_value=b"v1")},
], ids=["double status", "spaced status", "status past INTEGER", "bool model", "int model",
        "bytes version"])
def test_values_the_sql_might_read_otherwise_leave_the_request_to_the_store(
        compiled: bool, attributes: dict[str, AnyValue]) -> None:
    spans = decode("traces", _one_span(attributes), "protobuf", compiled=compiled)["spans"]
    assert not decoder_derived(SPANS, spans)
    assert not set(DERIVED) & set(spans.column_names)


def test_a_flush_mixing_decoded_and_sql_derived_requests_stores_each_rows_values(
        tmp_path: Path) -> None:
    decoded = decode("traces", _one_span({semconv.MODEL_ATTR: _s("a"),
                                          semconv.HTTP_STATUS_ATTR: _i(503)}), "protobuf")
    in_sql = decode("traces", _one_span({semconv.MODEL_ATTR: _s("b"),
                                         semconv.HTTP_STATUS_ATTR: AnyValue(double_value=404.0)},
                                        {semconv.REPLICA_ATTR: _s("r")}, code=2), "protobuf")
    assert decoder_derived(SPANS, decoded["spans"])
    assert not decoder_derived(SPANS, in_sql["spans"])
    store = Store(tmp_path / "t.duckdb")
    writer = BatchWriter(store, max_delay_s=0.5)  # long enough for both to join one commit

    async def both() -> list[int]:
        return list(await asyncio.gather(writer.submit(dict(decoded)),
                                         writer.submit(dict(in_sql))))

    try:
        assert asyncio.run(both()) == [1, 1]
        assert writer.commits == 1
        assert store.query(f"SELECT {', '.join(DERIVED)} FROM spans ORDER BY model").rows == [
            ("a", None, None, 503, True, None, None), ("b", None, "r", 404, True, None, None)]
    finally:
        writer.close()
        store.close()

"""Fuzzing the OTLP decoders: any input either decodes or raises DecodeError - never another
exception, never a hang."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from aiops.errors import DecodeError
from collectors.otlp.decode import SIGNALS, decode
from tests.aiops.server.test_app import OTLP_JSON_TRACE

FUZZ = settings(max_examples=300, deadline=2000,
                suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=30)

OTLP_KEYS = ["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId",
             "name", "kind", "startTimeUnixNano", "endTimeUnixNano", "attributes", "key",
             "value", "stringValue", "intValue", "events", "links", "status", "code",
             "resourceLogs", "scopeLogs", "logRecords", "body", "resourceMetrics",
             "scopeMetrics", "metrics", "gauge", "sum", "histogram", "dataPoints",
             "asDouble", "asInt", "timeUnixNano", "bucketCounts", "explicitBounds"]

otlp_shaped = st.recursive(
    st.none() | st.integers(min_value=-2**65, max_value=2**65) | st.text(max_size=34)
    | st.sampled_from(["5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "", "zz"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(OTLP_KEYS),
                                                                inner, max_size=5),
    max_leaves=40)


def outcome(signal: str, body: bytes, encoding: str) -> None:
    """Decoding either works or raises DecodeError; anything else fails the test."""
    with contextlib.suppress(DecodeError):
        decode(signal, body, encoding)


@FUZZ
@given(signal=st.sampled_from(sorted(SIGNALS)), body=st.binary(max_size=512))
def test_random_bytes_as_protobuf(signal: str, body: bytes) -> None:
    outcome(signal, body, "protobuf")


@FUZZ
@given(signal=st.sampled_from(sorted(SIGNALS)), doc=json_values)
def test_random_json(signal: str, doc: Any) -> None:
    outcome(signal, json.dumps(doc, allow_nan=True).encode(), "json")


@FUZZ
@given(signal=st.sampled_from(sorted(SIGNALS)), doc=otlp_shaped)
def test_otlp_shaped_json(signal: str, doc: Any) -> None:
    outcome(signal, json.dumps(doc).encode(), "json")


VALID = ExportTraceServiceRequest()
VALID_JSON = json.dumps(OTLP_JSON_TRACE).encode()


@FUZZ
@given(data=st.data())
def test_mutated_valid_requests(data: st.DataObject) -> None:
    from google.protobuf import json_format

    from collectors.otlp.decode import _hex_ids_to_base64

    json_format.ParseDict(_hex_ids_to_base64(OTLP_JSON_TRACE), VALID)
    for body, encoding in ((VALID.SerializeToString(), "protobuf"), (VALID_JSON, "json")):
        raw = bytearray(body)
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        outcome("traces", bytes(raw), encoding)


@pytest.mark.parametrize("body", [b"\x0a" * 10_000, b"\x0a\xff\xff\xff\xff\x0f", b"[" * 5000])
def test_pathological_nesting_and_lengths_are_decode_errors(body: bytes) -> None:
    for encoding in ("protobuf", "json"):
        outcome("traces", body, encoding)

"""A model replica without Ray: the echo backend, real OTLP export into a real aiops server."""

from __future__ import annotations

import asyncio
import bisect
import secrets
from collections.abc import Iterator

import pytest

from aiops.errors import ModelError
from serve.replica import ModelReplica
from serve.specs import ModelSpec
from serve.telemetry import TTFT_BUCKETS_S, TelemetryConfig
from tests.conftest import RunningServer

SPEC = ModelSpec.model_validate({"name": "echo", "version": "v3", "backend": "echo",
                                 "model_type": "llm"})


@pytest.fixture
def replica(server: RunningServer) -> Iterator[ModelReplica]:
    r = ModelReplica(SPEC, TelemetryConfig(server.url, 60.0), {"service.instance.id": "r-1"})
    yield r
    r.close()


def carrier() -> tuple[dict[str, str], str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return {"traceparent": f"00-{trace_id}-{parent}-01"}, trace_id, parent


PAYLOAD = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8,
           "temperature": 0.0}


def test_generate_records_a_child_span_a_log_and_metrics(
    replica: ModelReplica, server: RunningServer,
) -> None:
    c, trace_id, parent = carrier()
    out = asyncio.run(replica.generate(PAYLOAD, c, "inf-1"))
    assert out["text"] == "one two three" and out["completion_tokens"] == 3
    replica.telemetry.flush()
    span = server.store.query(
        "SELECT name, parent_span_id, service_name, (attributes->>'gen_ai.usage.output_tokens'),"
        " (resource_attributes->>'service.instance.id') FROM spans WHERE trace_id = ?",
        [trace_id]).rows
    assert span == [("chat echo", parent, "echo", "3", "r-1")]
    logs = server.store.query("SELECT (attributes->>'inference_id') FROM logs WHERE trace_id = ?",
                              [trace_id]).rows
    assert logs == [("inf-1",)]
    names = {r[0] for r in server.store.query(
        "SELECT DISTINCT name FROM metric_points WHERE (attributes->>'aiops.model.version') = 'v3'"
    ).rows}
    assert {"gen_ai.server.request.duration", "gen_ai.client.token.usage",
            "aiops.model.requests"} <= names


def test_streaming_ends_with_usage_and_records_ttft(
    replica: ModelReplica, server: RunningServer,
) -> None:
    c, _, _ = carrier()

    async def collect() -> list[dict[str, object]]:
        return [d async for d in replica.stream(PAYLOAD, c, "inf-2")]

    deltas = asyncio.run(collect())
    assert "".join(str(d["text"]) for d in deltas) == "one two three"
    assert deltas[-1]["finish_reason"] == "stop" and deltas[-1]["completion_tokens"] == 3
    replica.telemetry.flush()
    rows = server.store.query(
        "SELECT explicit_bounds, bucket_counts, count, sum FROM metric_points WHERE name = "
        "'gen_ai.server.time_to_first_token' ORDER BY time DESC LIMIT 1").rows
    assert rows, "no TTFT histogram point"
    bounds, buckets, count, total = rows[0]
    # Bounds in seconds, the unit recorded (the SDK's default bounds are for milliseconds:
    # every TTFT in the first bucket, no percentile), and the sample in its own bucket.
    assert list(bounds) == list(TTFT_BUCKETS_S)
    ttft = total / count
    assert sum(buckets) == count and buckets[bisect.bisect_left(bounds, ttft)] >= 1


def test_an_output_schema_violation_is_a_model_error_and_an_error_span(
    server: RunningServer,
) -> None:
    strict = SPEC.model_copy(update={"output_schema": {
        "type": "object", "properties": {"text": {"maxLength": 3}}}})
    replica = ModelReplica(strict, TelemetryConfig(server.url, 60.0))
    try:
        c, trace_id, _ = carrier()
        with pytest.raises(ModelError, match="output_schema"):
            asyncio.run(replica.generate(PAYLOAD, c, "inf-3"))
        replica.telemetry.flush()
        assert server.store.query("SELECT status_code FROM spans WHERE trace_id = ?",
                                  [trace_id]).rows == [("error",)]
    finally:
        replica.close()

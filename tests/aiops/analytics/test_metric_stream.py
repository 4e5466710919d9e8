"""Live metric anomalies: each serving signal's series streamed once through the live metric
detector, reported as context for incidents about the same model (never an incident alone)."""

from __future__ import annotations

from aiops.analytics.metric_stream import MetricStream
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_points

ATTRS = {"gen_ai.request.model": "echo", "aiops.model.version": "v1",
         "ray.serve.replica": "r1"}


def queue(t: int, depth: float) -> dict[str, object]:
    return {"time": t, "name": "aiops.serve.queue_depth", "type": "gauge", "value": depth,
            "attributes": dict(ATTRS)}


def test_a_queue_that_suddenly_fills_is_an_anomaly_of_its_model(store: Store) -> None:
    stream = MetricStream()
    add_points(store, [queue(T0 - (600 - k) * NS, float(k % 3)) for k in range(590)])
    assert stream.update(store, T0 - 9 * NS) == 0  # a steady 0-2 queue
    add_points(store, [queue(T0 - (8 - k) * NS, 40.0 + k) for k in range(8)])
    assert stream.update(store, T0) >= 1
    [first, *_] = stream.for_model("echo", T0 - 10 * NS)
    assert first["kind"] == "metric_anomaly" and first["id"] == "aiops.serve.queue_depth"
    assert first["value"] >= 40 and first["part"] == "r1"
    assert stream.for_model("other", 0) == []


def test_each_point_is_streamed_once(store: Store) -> None:
    stream = MetricStream()
    add_points(store, [queue(T0 - (100 - k) * NS, 1.0) for k in range(100)])
    stream.update(store, T0)
    stream.update(store, T0 + NS)
    assert stream.points == 100

"""What the collector sends lands in metric_points like any OTLP metric (no root needed)."""

from __future__ import annotations

import json

import httpx

from collectors.ebpf.export import SCOPE, SERVICE, build_request, send
from collectors.ebpf.probes import BOUNDS_S, SLOTS, Measurement
from tests.conftest import RunningServer


def test_histograms_counters_and_gauges_reach_the_store(server: RunningServer) -> None:
    buckets = [0] * SLOTS
    buckets[3] = 5  # five waits of 8-16 us
    points = [
        Measurement("aiops.ebpf.runq.latency", {"process.pid": 4242, "aiops.model.version": "v2"},
                    count=5, sum=60e-6, bucket_counts=buckets),
        Measurement("aiops.ebpf.oom.kills", {"process.pid": 4243}, value=1.0),
        Measurement("aiops.ebpf.collector.probe_attached", {"probe": "runq"}, value=1.0,
                    gauge=True),
    ]
    with httpx.Client() as client:
        send(client, server.url, build_request(points, 1_000_000_000, 2_000_000_000))
    rows = server.store.query(
        "SELECT name, type, temporality, count, sum, value, bucket_counts, explicit_bounds, "
        "attributes, service_name, scope_name FROM metric_points ORDER BY name").rows
    by_name = {r[0]: r for r in rows}
    hist = by_name["aiops.ebpf.runq.latency"]
    assert hist[1:5] == ("histogram", "delta", 5, 60e-6)
    assert hist[6] == buckets and hist[7] == list(BOUNDS_S)
    assert json.loads(hist[8]) == {"process.pid": 4242, "aiops.model.version": "v2"}
    assert (hist[9], hist[10]) == (SERVICE, SCOPE)
    assert by_name["aiops.ebpf.oom.kills"][1:3] == ("sum", "delta")
    assert by_name["aiops.ebpf.oom.kills"][5] == 1.0
    assert by_name["aiops.ebpf.collector.probe_attached"][1] == "gauge"


def test_an_unreachable_server_is_an_http_error_the_collector_can_count() -> None:
    with httpx.Client(timeout=2) as client:
        try:
            send(client, "http://127.0.0.1:9", build_request([], 0, 1))
        except httpx.HTTPError:
            return
    raise AssertionError("expected an HTTP error")

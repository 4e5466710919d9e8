"""``/metrics/otlp``: OTLP metrics sent to the real server come back in the Prometheus text
format, the way a Prometheus client library would have exposed them."""

from __future__ import annotations

import time

import httpx
import pyarrow as pa
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from aiops.schema import METRIC_POINTS
from aiops.server.exposition import (
    SharedScrape,
    StoreCollector,
    prometheus_label,
    prometheus_name,
)
from collectors.ebpf.export import build_request
from collectors.ebpf.probes import Measurement
from collectors.prometheus import Target, families_to_rows
from tests.collectors.test_remote_write import HEADERS, write_request
from tests.conftest import RunningServer

LABELS = {"gen_ai.request.model": "m", "aiops.model.version": "v2"}


def _send_replica_metrics(url: str, instance: str, requests: int) -> None:
    """What a Serve replica sends: cumulative counters and histograms, gauges."""
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{url}/v1/metrics"), export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "m", "service.instance.id": instance}),
        metric_readers=[reader],
        views=[View(instrument_name="gen_ai.server.request.duration",
                    aggregation=ExplicitBucketHistogramAggregation([0.1, 1.0]))])
    meter = provider.get_meter("test")
    counter = meter.create_counter("aiops.serve.requests", unit="{request}")
    hist = meter.create_histogram("gen_ai.server.request.duration", unit="s")
    in_flight = meter.create_up_down_counter("aiops.serve.in_flight", unit="{request}")
    meter.create_observable_gauge(
        "aiops.model.kv_cache.usage", unit="1",
        callbacks=[lambda _o: [Observation(0.25, LABELS)]])
    for i in range(requests):
        counter.add(1, {**LABELS, "http.response.status_code": 200})
        hist.record([0.05, 0.5, 3.0][i % 3], LABELS)
    in_flight.add(2, LABELS)
    provider.force_flush()
    provider.shutdown()


def _samples(url: str) -> dict[str, list[Sample]]:
    text = httpx.get(f"{url}/metrics/otlp").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_names_follow_opentelemetry_prometheus_compatibility() -> None:
    assert prometheus_label("gen_ai.request.model") == "gen_ai_request_model"
    assert prometheus_name("gen_ai.server.request.duration", "s", "histogram") == \
        "gen_ai_server_request_duration_seconds"
    assert prometheus_name("aiops.serve.requests", "{request}", "counter") == \
        "aiops_serve_requests"
    assert prometheus_name("aiops.model.kv_cache.usage", "1", "gauge") == \
        "aiops_model_kv_cache_usage_ratio"


def test_replica_metrics_come_back_as_counters_histograms_and_gauges(
    server: RunningServer,
) -> None:
    _send_replica_metrics(server.url, "r1", requests=3)
    samples = _samples(server.url)
    ident = {"service_name": "m", "service_instance_id": "r1", "gen_ai_request_model": "m",
             "aiops_model_version": "v2"}

    [requests] = samples["aiops_serve_requests"]
    assert requests.name == "aiops_serve_requests_total" and requests.value == 3
    assert requests.labels == {**ident, "http_response_status_code": "200"}

    buckets = {s.labels["le"]: s.value for s in samples["gen_ai_server_request_duration_seconds"]
               if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 1, "1.0": 2, "+Inf": 3}  # cumulative, as Prometheus wants
    totals = {s.name: s.value for s in samples["gen_ai_server_request_duration_seconds"]
              if not s.name.endswith("_bucket")}
    assert totals["gen_ai_server_request_duration_seconds_count"] == 3
    assert abs(totals["gen_ai_server_request_duration_seconds_sum"] - 3.55) < 1e-9

    assert [s.value for s in samples["aiops_model_kv_cache_usage_ratio"]] == [0.25]
    # An up-down counter is a non-monotonic sum: a gauge, not a counter.
    [in_flight] = samples["aiops_serve_in_flight"]
    assert in_flight.name == "aiops_serve_in_flight" and in_flight.value == 2


def test_each_replica_stays_its_own_series_and_the_latest_point_wins(
    server: RunningServer,
) -> None:
    _send_replica_metrics(server.url, "r1", requests=2)
    _send_replica_metrics(server.url, "r2", requests=5)
    _send_replica_metrics(server.url, "r1", requests=4)  # a later cumulative point of r1
    by_instance = {s.labels["service_instance_id"]: s.value
                   for s in _samples(server.url)["aiops_serve_requests"]}
    assert by_instance == {"r1": 4, "r2": 5}


def test_delta_and_scraped_series_are_left_out(server: RunningServer) -> None:
    now = time.time_ns()
    # The eBPF collector's delta points (summed in SQL instead) ...
    body = build_request([Measurement("aiops.ebpf.tcp.retransmits", {"process.pid": 1},
                                      value=2.0)], now - 10**9, now).SerializeToString()
    assert httpx.post(f"{server.url}/v1/metrics", content=body,
                      headers={"content-type": "application/x-protobuf"}).is_success
    # ... what the server scraped from a Prometheus endpoint (Prometheus scrapes it too) ...
    rows = families_to_rows("# TYPE ray_up gauge\nray_up 1\n",
                            Target("ray", "http://ray:8090/metrics"), now)
    server.store.append("metric_points",
                        pa.Table.from_pylist(rows, schema=METRIC_POINTS.arrow_schema))
    # ... and what a Prometheus pushed by remote write (it has them: 331k such series made
    # each scrape 4.7 s and 21.7 MiB).
    assert httpx.post(f"{server.url}/api/v1/write", content=write_request(
        ({"__name__": "ray_node_cpu", "job": "node"}, [(1.0, now // 10**6)])),
        headers=HEADERS).status_code == 204
    _send_replica_metrics(server.url, "r1", requests=1)
    samples = _samples(server.url)
    assert "aiops_serve_requests" in samples
    assert not [n for n in samples if "ebpf" in n or n.startswith("ray_")]
    assert server.store.query("SELECT count(*) FROM metric_points WHERE name = "
                              "'ray_node_cpu'").rows == [(1,)]


def test_a_scrape_exposes_at_most_max_series_and_says_it_left_some_out(
        server: RunningServer) -> None:
    for instance in ("r1", "r2", "r3"):
        _send_replica_metrics(server.url, instance, requests=1)
    capped = {f.name: f for f in StoreCollector(server.store, max_series=2).collect()}
    assert sum(len(f.samples) for n, f in capped.items() if n.startswith("aiops_serve")) <= 2 * 4
    assert capped["aiops_otlp_exposition_truncated"].samples[0].value == 1.0
    whole = {f.name: f for f in StoreCollector(server.store).collect()}
    assert whole["aiops_otlp_exposition_truncated"].samples[0].value == 0.0


def test_scrapers_at_once_share_one_scrape() -> None:
    """Forty scrapers at once: one query's text for all of them."""
    import asyncio

    calls = []

    def render() -> bytes:
        calls.append(time.monotonic())
        time.sleep(0.2)
        return b"text"

    shared = SharedScrape(render, cache_s=1.0)

    async def scrape_all() -> list[bytes]:
        return await asyncio.gather(*(shared.get() for _ in range(40)))

    assert asyncio.run(scrape_all()) == [b"text"] * 40
    assert len(calls) == 1


def test_series_without_a_recent_point_are_dropped(server: RunningServer) -> None:
    _send_replica_metrics(server.url, "r1", requests=1)
    later = StoreCollector(server.store, fresh_s=60, clock=lambda: time.time_ns() + 120 * 10**9)
    assert [f.name for f in later.collect()] == ["aiops_otlp_exposition_truncated"]
    assert [f.name for f in StoreCollector(server.store).collect()]

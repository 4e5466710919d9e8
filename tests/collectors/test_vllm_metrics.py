"""An attached vLLM server's metrics, scraped from a real exposition endpoint with vLLM's names
and labels, land twice: as scraped, and under the names the project's own serving emits (the
model as the service, its tag as the version), which the server re-exposes for the dashboards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from aiops.server.exposition import StoreCollector
from aiops.store import Store
from collectors.prometheus import Scraper, Target
from collectors.vllm_metrics import SCOPE
from tests.conftest import free_port

LABELS = ["model_name", "engine"]


@pytest.fixture
def vllm_endpoint() -> Iterator[str]:
    """vLLM's exposition, as its PrometheusStatLogger writes it (names with a colon)."""
    registry = CollectorRegistry()
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS,
          registry=registry).labels("team-chat", "0").set(0.25)
    Gauge("vllm:num_requests_waiting", "Requests waiting", LABELS,
          registry=registry).labels("team-chat", "0").set(3)
    Counter("vllm:prompt_tokens", "Prefill tokens", LABELS,
            registry=registry).labels("team-chat", "0").inc(40)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E latency", LABELS,
                    buckets=(0.3, 1.0, 5.0), registry=registry).labels("team-chat", "0")
    for v in (0.2, 0.8, 0.9, 7.0):
        e2e.observe(v)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join()


def test_vllm_metrics_land_as_scraped_and_under_the_projects_names(
        store: Store, vllm_endpoint: str) -> None:
    target = Target("team-vllm", vllm_endpoint, kind="vllm", version="SmolLM2-135M")
    Scraper([target], 60, lambda t: store.append("metric_points", t)).scrape_once()

    raw = store.query("SELECT value FROM metric_points WHERE service_name = 'team-vllm' "
                      "AND name = 'vllm:kv_cache_usage_perc'").rows
    assert raw == [(0.25,)]
    mapped = {r[0]: r[1:] for r in store.query(
        "SELECT name, value, unit, (attributes->>'gen_ai.request.model'), "
        "(attributes->>'aiops.model.version'), (resource_attributes->>'aiops.attach.target') "
        f"FROM metric_points WHERE service_name = 'team-chat' AND scope_name = '{SCOPE}'").rows}
    assert mapped["aiops.model.kv_cache.usage"] == (0.25, "1", "team-chat", "SmolLM2-135M",
                                                    "team-vllm")
    assert mapped["aiops.serve.queue_depth"][0] == 3.0
    # Counters vLLM has no project equivalent for stay only as scraped.
    assert set(mapped) == {"aiops.model.kv_cache.usage", "aiops.serve.queue_depth",
                           "gen_ai.server.request.duration"}
    (hist,) = store.query("SELECT count, bucket_counts, explicit_bounds FROM metric_points "
                          "WHERE name = 'gen_ai.server.request.duration'").rows
    assert hist == (4, [1, 2, 0, 1], [0.3, 1.0, 5.0])


def test_the_server_re_exposes_them_as_the_dashboards_query_them(
        store: Store, vllm_endpoint: str) -> None:
    target = Target("team-vllm", vllm_endpoint, kind="vllm", version="SmolLM2-135M")
    Scraper([target], 60, lambda t: store.append("metric_points", t)).scrape_once()
    families = {f.name: f for f in StoreCollector(store).collect()}
    (kv,) = families["aiops_model_kv_cache_usage_ratio"].samples
    assert kv.value == 0.25
    assert kv.labels["gen_ai_request_model"] == "team-chat"
    assert kv.labels["aiops_model_version"] == "SmolLM2-135M"
    assert "gen_ai_server_request_duration_seconds" in families
    # The raw vLLM names are not re-exposed: Prometheus can scrape vLLM itself.
    assert not any(name.startswith("vllm") for name in families)

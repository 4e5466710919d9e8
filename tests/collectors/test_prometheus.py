"""The Prometheus scraper against a real exposition endpoint (prometheus_client's HTTP server):
counters, gauges, histograms and summaries land usable for rates and quantiles."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    start_http_server,
)

from aiops.store import Store
from collectors.prometheus import Scraper, Target, parse_targets
from tests.conftest import free_port


@pytest.fixture
def endpoint() -> Iterator[str]:
    registry = CollectorRegistry()
    c = Counter("requests", "Requests", ["route"], registry=registry)
    c.labels("/a").inc(3)
    c.labels("/b").inc(5)
    Gauge("queue_depth", "Queue", registry=registry).set(7)
    h = Histogram("latency_seconds", "Latency", buckets=(0.1, 0.5, 1.0), registry=registry)
    for v in (0.05, 0.2, 0.3, 0.7, 2.0):
        h.observe(v)
    s = Summary("payload_bytes", "Payload", registry=registry)
    s.observe(100)
    s.observe(300)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join()


def scrape(store: Store, targets: list[Target]) -> None:
    Scraper(targets, 60, lambda t: store.append("metric_points", t)).scrape_once()


def test_counters_gauges_histograms_and_summaries(store: Store, endpoint: str) -> None:
    scrape(store, [Target("app", endpoint)])
    rows = {(r[0], r[1]): r[2:] for r in store.query(
        "SELECT name, (attributes->>'route'), type, temporality, is_monotonic, value, "
        "service_name FROM metric_points WHERE name IN ('requests_total', 'queue_depth')").rows}
    assert rows[("requests_total", "/a")] == ("sum", "cumulative", True, 3.0, "app")
    assert rows[("requests_total", "/b")][3] == 5.0
    assert rows[("queue_depth", None)] == ("gauge", None, None, 7.0, "app")
    (hist,) = store.query("SELECT count, sum, bucket_counts, explicit_bounds FROM "
                          "metric_points WHERE name = 'latency_seconds'").rows
    assert hist == (5, pytest.approx(3.25), [1, 2, 1, 1], [0.1, 0.5, 1.0])
    (summ,) = store.query("SELECT count, sum, type FROM metric_points "
                          "WHERE name = 'payload_bytes'").rows
    assert summ == (2, 400.0, "summary")
    assert store.query("SELECT value FROM metric_points WHERE name = 'up'").rows == [(1.0,)]


def test_a_down_target_records_up_0_and_the_others_still_land(store: Store,
                                                              endpoint: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    scrape(store, [Target("gone", dead), Target("app", endpoint)])
    up = dict(store.query("SELECT service_name, value FROM metric_points "
                          "WHERE name = 'up'").rows)
    assert up == {"gone": 0.0, "app": 1.0}
    assert store.count("metric_points") > 5


def test_a_target_that_stays_down_is_reported_once_and_counted_every_time(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    scraper = Scraper([Target("gone", f"http://127.0.0.1:{free_port()}/metrics")], 60,
                      lambda t: store.append("metric_points", t), timeout_s=1)
    try:
        with caplog.at_level(logging.DEBUG, logger="collectors.prometheus"):
            for _ in range(3):
                scraper.scrape_once()
    finally:
        scraper.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "scrape of gone" in warnings[0].getMessage()
    assert scraper.errors["gone"] == 3
    assert store.query("SELECT count(*) FROM metric_points WHERE name = 'up' "
                       "AND value = 0").rows[0][0] == 3


def test_target_lists_are_validated() -> None:
    assert parse_targets("ray=http://127.0.0.1:8090/metrics, x=https://h/m") == [
        Target("ray", "http://127.0.0.1:8090/metrics"), Target("x", "https://h/m")]
    with pytest.raises(ValueError, match="job=http"):
        parse_targets("nourl")

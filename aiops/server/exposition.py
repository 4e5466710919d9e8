"""OTLP metrics from the store, re-exposed in the Prometheus text format (``/metrics/otlp``).

Serve replicas and the Serve driver send their metrics (``gen_ai.*``, ``aiops.serve.*``) to the
server as OTLP, so they live in DuckDB, not in any Prometheus endpoint. This collector plays
the part of the OpenTelemetry Collector's Prometheus exporter: each scrape reads, per series,
the latest point received in the last ``fresh_s`` seconds and exposes it the way a Prometheus
client library would have.

What is exposed: gauges, cumulative sums (monotonic ones as counters) and cumulative
explicit-bucket histograms. What is not: delta series (the eBPF collector's; turning them into
counters needs state in the server, and their per-process labels would flood Prometheus: they
are aggregated in SQL instead), exponential histograms and summaries, and the series that came
from Prometheus: scraped by the server from Prometheus endpoints (Prometheus scrapes those
directly) or pushed by remote write (a Prometheus has them already).

A scrape is bounded as a SQL query is: at most ``max_series`` series (the first by name; the
rest are counted in ``aiops_otlp_exposition_series_left_out``) and ``timeout_s`` of query
time; the route serves one scrape's text to every scrape within ``cache_s`` and computes one at
a time, so many scrapers at once cost one query.

Series identity is (name, service.name, service.instance.id, point attributes): two replicas of
one deployment stay two series, so one replica's restart is one counter reset, not a drop in a
sum. Names follow OpenTelemetry's Prometheus compatibility rules: dots become underscores,
the unit becomes a suffix (``s`` -> ``_seconds``), counters end in ``_total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.concurrency import run_in_threadpool

from aiops.errors import AIOpsError
from aiops.store import Store
from collectors.prometheus import SCOPE as SCRAPED_SCOPE
from collectors.remote_write import SCOPE as REMOTE_WRITE_SCOPE

__all__ = ["SharedScrape", "StoreCollector", "prometheus_label", "prometheus_name"]

log = logging.getLogger(__name__)

# Labels added from the resource; point attributes with the same name would be ambiguous.
SERVICE_LABEL = "service_name"
INSTANCE_LABEL = "service_instance_id"

_UNIT_SUFFIX = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")

_LATEST = f"""
SELECT name, type, is_monotonic, unit, description, service_name,
       (resource_attributes->>'service.instance.id') AS instance, attributes,
       value, count, sum, bucket_counts, explicit_bounds
FROM metric_points
WHERE time > make_timestamp_ns(?)
  AND coalesce(scope_name, '') NOT IN ('{SCRAPED_SCOPE}', '{REMOTE_WRITE_SCOPE}')
  AND (type = 'gauge' OR (type IN ('sum', 'histogram') AND temporality = 'cumulative'))
QUALIFY row_number() OVER (PARTITION BY name, type, service_name, instance, attributes
                           ORDER BY time DESC) = 1
ORDER BY name, service_name, instance, attributes
LIMIT ?
"""


def prometheus_label(key: str) -> str:
    """An OTel attribute key as a Prometheus label name (``gen_ai.request.model`` ->
    ``gen_ai_request_model``)."""
    name = _INVALID.sub("_", key)
    return f"_{name}" if name[:1].isdigit() else name


def prometheus_name(name: str, unit: str | None, kind: str) -> str:
    """An OTel metric name as a Prometheus family name (without ``_total``, which the counter
    family adds): the unit as a suffix, ``1`` on a gauge as ``_ratio``, ``{...}`` dropped."""
    base = prometheus_label(name)
    unit = unit or ""
    suffix = _UNIT_SUFFIX.get(unit, "")
    if unit == "1" and kind == "gauge":
        suffix = "ratio"
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return base


class StoreCollector:
    """A ``prometheus_client`` collector over ``metric_points`` (register it in a registry)."""

    def __init__(self, store: Store, fresh_s: float = 60.0,
                 clock: Callable[[], int] = time.time_ns, max_series: int = 20_000,
                 timeout_s: float = 5.0) -> None:
        self.store = store
        self.fresh_s = fresh_s
        self.clock = clock
        self.max_series = max_series
        self.timeout_s = timeout_s
        self.failures = 0
        self.left_out = 0  # series past max_series at the last scrape (1: some)

    def collect(self) -> Iterator[Metric]:
        since = self.clock() - int(self.fresh_s * 1e9)
        try:
            result = self.store.query(_LATEST, [since, self.max_series + 1],
                                      timeout_s=self.timeout_s)
        except AIOpsError as exc:
            # A scrape must still answer (with the server's own metrics): log, count, go on.
            self.failures += 1
            log.warning("cannot read OTLP metrics for /metrics/otlp: %s", exc)
            return
        rows = result.rows[:self.max_series]
        self.left_out = len(result.rows) - len(rows)
        if self.left_out:
            log.warning("/metrics/otlp: more than %d series; the rest are left out",
                        self.max_series)
        families: dict[tuple[str, str], Metric] = {}
        for row in rows:
            if not self._add(families, _Point(*row)):
                log.debug("skipped an incomplete point of %s", row[0])
        yield from families.values()
        left = GaugeMetricFamily("aiops_otlp_exposition_truncated",
                                 f"1 when there were more series than the {self.max_series} "
                                 "one scrape exposes")
        left.add_metric([], 1.0 if self.left_out else 0.0)
        yield left

    @staticmethod
    def _add(families: dict[tuple[str, str], Metric], p: _Point) -> bool:
        labels = {SERVICE_LABEL: p.service or "", INSTANCE_LABEL: p.instance or ""}
        for key, v in _attributes(p.attributes).items():
            labels.setdefault(prometheus_label(key), v if isinstance(v, str) else json.dumps(v))
        shape = ("counter" if p.kind == "sum" and p.monotonic
                 else "histogram" if p.kind == "histogram" else "gauge")
        name = prometheus_name(p.name, p.unit, shape)
        family = families.get((name, shape))
        if family is None:
            make = {"counter": CounterMetricFamily, "histogram": HistogramMetricFamily,
                    "gauge": GaugeMetricFamily}[shape]
            family = families[(name, shape)] = make(name, p.doc or p.name)
        # Series of one family may carry different label names (attributes differ per
        # point), so samples are added one by one, each with its own labels.
        if shape == "histogram":
            if not p.buckets or p.bounds is None or len(p.buckets) != len(p.bounds) + 1:
                return False
            _add_histogram(family, labels, p.buckets, p.bounds, p.total or 0.0)
            return True
        if p.value is None:
            return False
        family.add_sample(family.name + ("_total" if shape == "counter" else ""), labels,
                          p.value)
        return True


class SharedScrape:
    """One scrape's text for every scraper within ``cache_s``, computed by one at a time (on
    a worker thread; the others wait on the event loop, holding no thread): forty scrapers
    at once cost one query, not forty, and leave the thread pool to ingest and /readyz."""

    def __init__(self, render: Callable[[], bytes], cache_s: float = 1.0) -> None:
        self.render, self.cache_s = render, cache_s
        self._lock: asyncio.Lock | None = None
        self._body = b""
        self._at = -1e18

    async def get(self) -> bytes:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self._at > self.cache_s:
                self._body = await run_in_threadpool(self.render)
                self._at = time.monotonic()
            return self._body


@dataclass(frozen=True)
class _Point:
    name: str
    kind: str
    monotonic: bool | None
    unit: str | None
    doc: str | None
    service: str | None
    instance: str | None
    attributes: str | None
    value: float | None
    count: int | None
    total: float | None
    buckets: list[int] | None
    bounds: list[float] | None


def _attributes(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _add_histogram(family: Metric, labels: dict[str, str], buckets: list[int],
                   bounds: list[float], total: float) -> None:
    # OTLP keeps per-bucket counts; Prometheus buckets are cumulative, the last one +Inf.
    running = 0
    for bound, n in zip([*bounds, float("inf")], buckets, strict=True):
        running += n
        le = "+Inf" if bound == float("inf") else _float_text(bound)
        family.add_sample(f"{family.name}_bucket", {**labels, "le": le}, running)
    family.add_sample(f"{family.name}_count", labels, running)
    family.add_sample(f"{family.name}_sum", labels, total)


def _float_text(x: float) -> str:
    return repr(float(x))

"""Prometheus scraper: configured targets (Ray's metrics endpoint by default), scraped at an
interval into ``metric_points`` with their labels.

Counters land as cumulative monotonic sums and histograms as explicit-bucket histograms with
per-bucket (not cumulative) counts and their bounds, exactly as OTLP metrics do, so rates and
quantiles are computed the same way whichever way a metric arrived. Each scrape also records
``up`` (1 or 0) per target, as Prometheus does. A failing target is logged, counted and
retried next interval; it never stops the others.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from aiops.periodic import Health, Periodic, PeriodicMetrics
from aiops.schema import METRIC_POINTS
from collectors import vllm_metrics

__all__ = ["Scraper", "Target", "families_to_rows", "parse_targets"]

log = logging.getLogger(__name__)

SCOPE = "aiops.prometheus"


@dataclass(frozen=True)
class Target:
    job: str
    url: str
    # "vllm": the rows are also added under the project's names (collectors.vllm_metrics), with
    # ``version`` standing for the model's version.
    kind: str = "prometheus"
    version: str | None = None


def parse_targets(value: str) -> list[Target]:
    """``job=url,job=url`` (the ``AIOPS_SCRAPE_TARGETS`` format)."""
    targets = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        job, sep, url = part.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise ValueError(f"scrape target {part!r} is not job=http://host:port/path")
        targets.append(Target(job.strip(), url.strip()))
    return targets


def _dumps(obj: Any) -> str | None:
    return orjson.dumps(obj).decode() if obj else None


def families_to_rows(text: str, target: Target, now_ns: int) -> list[dict[str, Any]]:
    """Prometheus text exposition -> metric_points rows."""
    resource = {"service.name": target.job, "scrape.url": target.url}
    base = {"service_name": target.job, "resource_attributes": _dumps(resource),
            "scope_name": SCOPE}
    rows: list[dict[str, Any]] = []
    for fam in text_string_to_metric_families(text):
        if fam.type in ("histogram", "gaugehistogram"):
            rows += _histograms(fam, base, now_ns)
            continue
        if fam.type == "summary":
            rows += _summaries(fam, base, now_ns)
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue  # creation timestamps, not values
            is_counter = fam.type == "counter"
            rows.append({**base, "time": _time(s, now_ns), "name": s.name,
                         "description": fam.documentation or None, "unit": fam.unit or None,
                         "type": "sum" if is_counter else "gauge",
                         "temporality": "cumulative" if is_counter else None,
                         "is_monotonic": True if is_counter else None,
                         "value": float(s.value), "attributes": _dumps(dict(s.labels))})
    return rows


def _time(sample: Any, now_ns: int) -> int:
    return int(sample.timestamp * 1e9) if sample.timestamp else now_ns


def _group(samples: Iterable[Any], drop: str) -> dict[tuple[tuple[str, str], ...], list[Any]]:
    groups: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != drop))
        groups.setdefault(key, []).append(s)
    return groups


def _histograms(fam: Any, base: dict[str, Any], now_ns: int) -> list[dict[str, Any]]:
    rows = []
    for labels, samples in _group(fam.samples, "le").items():
        buckets = sorted(((float(s.labels["le"]), s.value) for s in samples
                          if s.name.endswith("_bucket")), key=lambda b: b[0])
        count = next((s.value for s in samples if s.name.endswith(("_count", "_gcount"))), None)
        total = next((s.value for s in samples if s.name.endswith(("_sum", "_gsum"))), None)
        cumulative = [c for _, c in buckets]
        per_bucket = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]],
                                                  strict=True)]
        rows.append({**base, "time": _time(samples[0], now_ns), "name": fam.name,
                     "description": fam.documentation or None, "unit": fam.unit or None,
                     "type": "histogram", "temporality": "cumulative",
                     "count": int(count) if count is not None else None, "sum": total,
                     "bucket_counts": per_bucket,
                     "explicit_bounds": [le for le, _ in buckets if not math.isinf(le)],
                     "attributes": _dumps(dict(labels))})
    return rows


def _summaries(fam: Any, base: dict[str, Any], now_ns: int) -> list[dict[str, Any]]:
    rows = []
    for labels, samples in _group(fam.samples, "quantile").items():
        quantiles = [{"quantile": float(s.labels["quantile"]), "value": s.value}
                     for s in samples if "quantile" in s.labels]
        count = next((s.value for s in samples if s.name.endswith("_count")), None)
        total = next((s.value for s in samples if s.name.endswith("_sum")), None)
        rows.append({**base, "time": _time(samples[0], now_ns), "name": fam.name,
                     "description": fam.documentation or None, "type": "summary",
                     "count": int(count) if count is not None else None, "sum": total,
                     "quantiles": _dumps(quantiles), "attributes": _dumps(dict(labels))})
    return rows


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    names = METRIC_POINTS.column_names
    return pa.Table.from_pydict({n: [r.get(n) for r in rows] for n in names},
                                schema=METRIC_POINTS.arrow_schema)


class Scraper:
    """Scrapes every target each ``interval_s`` on a background thread and hands the rows to
    ``sink`` (the server's group-commit writer)."""

    def __init__(self, targets: list[Target], interval_s: float,
                 sink: Callable[[pa.Table], object], timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None,
                 metrics: PeriodicMetrics | None = None) -> None:
        self.targets = targets
        self.interval_s = interval_s
        self.sink = sink
        self.errors: dict[str, int] = {t.job: 0 for t in targets}
        self._http = httpx.Client(timeout=timeout_s, transport=transport)
        self._down: set[str] = set()  # jobs whose last scrape failed
        self._worker = Periodic("prometheus-scraper", interval_s, self.scrape_once,
                                metrics=metrics)

    def set_targets(self, targets: list[Target]) -> None:
        """Replace the targets (attached serving comes and goes); the next round uses them."""
        self.targets = list(targets)

    def scrape_once(self) -> int:
        rows: list[dict[str, Any]] = []
        for target in self.targets:
            now = time.time_ns()
            up = 0.0
            try:
                resp = self._http.get(target.url)
                resp.raise_for_status()
                scraped = families_to_rows(resp.text, target, now)
                if target.kind == "vllm":
                    scraped += vllm_metrics.normalize(scraped, target.job, target.version)
                rows += scraped
                up = 1.0
            except (httpx.HTTPError, ValueError) as exc:
                self.errors[target.job] = self.errors.get(target.job, 0) + 1
                # Said once when a target goes down (counted every time, and its `up` series
                # says 0), not every interval while it stays down.
                level = logging.DEBUG if target.job in self._down else logging.WARNING
                self._down.add(target.job)
                log.log(level, "scrape of %s (%s) failed: %s", target.job, target.url, exc)
            if up and target.job in self._down:
                self._down.discard(target.job)
                log.info("scrape of %s (%s) works again", target.job, target.url)
            rows.append({"service_name": target.job, "scope_name": SCOPE, "time": now,
                         "name": "up", "type": "gauge", "value": up,
                         "resource_attributes": _dumps({"service.name": target.job,
                                                        "scrape.url": target.url}),
                         "attributes": _dumps({"job": target.job})})
        if rows:
            self.sink(to_table(rows))
        return len(rows)

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        self._worker.close(timeout_s=10)
        self._http.close()

    def health(self) -> Health:
        return self._worker.health()

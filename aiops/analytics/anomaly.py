"""Streaming anomaly detection for metric series: the detector protocol, anomaly records, and
one detector per series identity.

The default detector of a series is :class:`~aiops.analytics.cad.SeriesDetector` (contextual and
range novelty, bounded state; see :mod:`aiops.analytics.cad`), re-exported here with its
:class:`~aiops.analytics.cad.DetectorConfig`; any :class:`MetricDetector` can stand in for it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from aiops.analytics.cad import DetectorConfig, SeriesDetector

__all__ = [
    "Anomaly",
    "DetectorConfig",
    "MetricDetector",
    "MultiSeriesDetector",
    "SeriesDetector",
]


class MetricDetector(Protocol):
    """A streaming detector of one series: the score in [0, 1] of each new point, from the
    points before it only."""

    def update(self, t: float, value: float) -> float: ...


@dataclass(frozen=True)
class Anomaly:
    """A point whose score reached the detector's threshold."""

    series: Hashable
    time: float
    value: float
    score: float
    reason: str


class MultiSeriesDetector:
    """One detector per series identity (e.g. metric name + labels); the least recently
    updated series are forgotten beyond ``max_series``.

    By default each series gets a ``SeriesDetector(config)``, reported from its threshold;
    ``factory`` gives any ``MetricDetector`` instead (e.g. ``aiops.analytics.metric_live.
    live_detector``), reported from ``threshold``.
    """

    def __init__(self, config: DetectorConfig | None = None, max_series: int = 10_000, *,
                 factory: Callable[[], MetricDetector] | None = None,
                 threshold: float | None = None) -> None:
        self.config = config or DetectorConfig()
        self.max_series = max_series
        self.threshold = self.config.threshold if threshold is None else threshold
        self._factory: Callable[[], MetricDetector] = factory or (
            lambda: SeriesDetector(self.config))
        self._series: OrderedDict[Hashable, MetricDetector] = OrderedDict()

    def update(self, series: Hashable, t: float, value: float) -> float:
        detector = self._series.get(series)
        if detector is None:
            detector = self._series[series] = self._factory()
            if len(self._series) > self.max_series:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(series)
        return detector.update(t, value)

    def observe(self, series: Hashable, t: float, value: float) -> Anomaly | None:
        """Update, and return an anomaly record when the score reaches the threshold."""
        score = self.update(series, t, value)
        if score < self.threshold:
            return None
        return Anomaly(series, t, value, score, getattr(self._series[series], "reason", ""))

    def __len__(self) -> int:
        return len(self._series)

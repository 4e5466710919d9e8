"""New-template and template-rate anomalies of a log stream mined by :mod:`aiops.analytics.logs`.

:class:`TemplateRateDetector` counts messages per template and time bucket and reports
templates never seen before and buckets whose count departs from the template's robust baseline.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

if TYPE_CHECKING:  # only for annotations: aiops.analytics.logs imports this module
    from aiops.analytics.logs import TemplateMatch

__all__ = ["TemplateAnomaly", "TemplateRateDetector"]


@dataclass(frozen=True)
class TemplateAnomaly:
    """One finding for one template and time bucket ``[window_start_ns, window_end_ns)``.

    ``kind`` is ``"new_template"`` (a template first seen after the warm-up; ``expected`` 0) or
    ``"rate"`` (a count far from the template's baseline, above or below it). ``score`` is
    ``-log10`` of the tail probability of ``observed`` under the baseline (``inf`` for a new
    template).
    """

    kind: Literal["new_template", "rate"]
    template_id: int
    template: str
    window_start_ns: int
    window_end_ns: int
    observed: int
    expected: float
    score: float


@dataclass
class _Series:
    template: str
    counts: deque[int]


class TemplateRateDetector:
    """Streaming per-template counts in fixed time buckets, each closed bucket checked against
    the template's own recent buckets.

    The baseline of a template is robust to earlier bursts: its expected count is the larger of
    the median and the 10%-trimmed mean of the last ``history`` buckets (the mean keeps sporadic
    templates above zero), and its spread the MAD. Counts are Poisson around the expectation, or
    negative binomial when the MAD says they are over-dispersed; a bucket is anomalous when its
    count is that unlikely (``-log10 p >= threshold``) and at least ``min_delta`` away.
    Messages must come roughly in time order: one older than the open bucket counts in it.
    """

    def __init__(self, bucket_ns: int = 60 * 10**9, *, history: int = 60, warmup: int = 10,
                 threshold: float = 6.0, min_delta: float = 3.0) -> None:
        if bucket_ns <= 0 or warmup < 1 or history < warmup:
            raise ValueError("need bucket_ns > 0 and 1 <= warmup <= history")
        self.bucket_ns = bucket_ns
        self.history, self.warmup = history, warmup
        self.threshold, self.min_delta = threshold, min_delta
        self._series: dict[int, _Series] = {}
        self._bucket: int | None = None  # index of the open bucket
        self._closed = 0  # buckets closed so far
        self._counts: dict[int, int] = {}
        self._new: set[int] = set()

    def observe(self, time_ns: int, match: TemplateMatch) -> list[TemplateAnomaly]:
        """Count one message; returns the anomalies of the buckets this message closed."""
        bucket = time_ns // self.bucket_ns
        found = []
        if self._bucket is None:
            self._bucket = bucket
        elif bucket > self._bucket:
            found = self._close_until(bucket)
        series = self._series.get(match.template_id)
        if series is None:
            series = self._series[match.template_id] = _Series(match.template,
                                                               deque(maxlen=self.history))
            if self._closed >= self.warmup:
                self._new.add(match.template_id)
        series.template = match.template
        self._counts[match.template_id] = self._counts.get(match.template_id, 0) + 1
        return found

    def flush(self) -> list[TemplateAnomaly]:
        """Close the open bucket (end of a replay, or a clock tick with no messages)."""
        if self._bucket is None:
            return []
        return self._close_until(self._bucket + 1)

    def _close_until(self, bucket: int) -> list[TemplateAnomaly]:
        """Close the open bucket and the empty ones up to ``bucket``. After ``history`` empty
        buckets every baseline is all zeros, so a longer silence changes nothing more."""
        assert self._bucket is not None
        found = []
        for b in range(self._bucket, min(bucket, self._bucket + self.history + 1)):
            found += self._close(b)
        self._bucket = bucket
        return found

    def _close(self, bucket: int) -> list[TemplateAnomaly]:
        window = (bucket * self.bucket_ns, (bucket + 1) * self.bucket_ns)
        found = []
        for tid, series in self._series.items():
            observed = self._counts.get(tid, 0)
            if tid in self._new:
                found.append(TemplateAnomaly("new_template", tid, series.template, *window,
                                             observed, 0.0, math.inf))
            elif len(series.counts) >= self.warmup:
                anomaly = self._rate(tid, series, observed, window)
                if anomaly is not None:
                    found.append(anomaly)
            series.counts.append(observed)
        self._counts.clear()
        self._new.clear()
        self._closed += 1
        return sorted(found, key=lambda a: -a.score)

    def _rate(self, tid: int, series: _Series, observed: int,
              window: tuple[int, int]) -> TemplateAnomaly | None:
        expected, variance = _baseline(np.asarray(series.counts, dtype=np.float64))
        if abs(observed - expected) < self.min_delta:
            return None
        score = _surprise(observed, expected, variance)
        if score < self.threshold:
            return None
        return TemplateAnomaly("rate", tid, series.template, *window, observed, expected, score)


def _baseline(counts: npt.NDArray[np.float64]) -> tuple[float, float]:
    """Robust expected count and variance of a template's past buckets."""
    median = float(np.median(counts))
    expected = max(median, float(stats.trim_mean(counts, 0.1)), 0.5)
    spread = 1.4826 * float(np.median(np.abs(counts - median)))
    return expected, spread * spread


def _surprise(observed: int, expected: float, variance: float) -> float:
    """``-log10`` of the probability of a count at least as far out as ``observed``."""
    if variance > expected:  # over-dispersed: negative binomial with this mean and variance
        n, p = expected * expected / (variance - expected), expected / variance
        tail = (stats.nbinom.sf(observed - 1, n, p) if observed > expected
                else stats.nbinom.cdf(observed, n, p))
    else:
        tail = (stats.poisson.sf(observed - 1, expected) if observed > expected
                else stats.poisson.cdf(observed, expected))
    return -math.log10(max(float(tail), 1e-300))

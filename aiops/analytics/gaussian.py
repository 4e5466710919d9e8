"""Cheap streaming metric detectors: tail probabilities of a value under recent statistics.

Every detector here scores a point from the points before it only (no look-ahead), holds a
bounded number of values, and returns a score in [0, 1] from ``update(t, value)``:

* ``WindowedGaussian``: NAB's "windowedGaussian" reference detector
  (numenta/NAB ``nab/detectors/gaussian/windowedGaussian_detector.py``), reproduced exactly:
  the mean and standard deviation of the last ``window`` values, refreshed every ``step``
  values once the window is full; score = 1 - Q(|z|), the normal probability of a value closer
  to the mean than this one (0.5 at the mean, towards 1 in the tails).
* ``RobustZScore``: z = (value - median) / (1.4826 * MAD) over the window, so that the
  anomalies already in the window do not inflate the scale; score = |z| / (1 + |z|). Not the
  normal tail: a MAD is often tiny (counts, quantised values), |z| then runs to hundreds, and
  1 - Q(|z|) is 1.0 in double precision from |z| = 8.3 on, leaving no threshold to choose.
* ``SeasonalResidual``: feeds an inner detector the difference between a value and the value
  one ``period`` earlier (same hour yesterday), so a daily cycle does not look anomalous.

Scores map |z| monotonically, so a threshold on them is a threshold on |z|: for the Gaussian
tail 0.99865 is 3 standard deviations and 0.9999997 is 5; for the robust score 0.75 is 3 and
0.99 is 99 (``robust_z`` inverts it).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

__all__ = [
    "RobustZScore",
    "SeasonalResidual",
    "WindowedGaussian",
    "normal_probability",
    "robust_z",
]

_SQRT2 = math.sqrt(2.0)
_MAD_TO_STD = 1.4826       # MAD of a normal distribution, in standard deviations
_MEAN_AD_TO_STD = 1.2533   # mean absolute deviation of a normal distribution, likewise
_MIN_STD = 0.000001        # NAB's floor for a flat window's standard deviation


def normal_probability(x: float, mean: float, std: float) -> float:
    """NAB's ``normalProbability``: the probability of a sample beyond ``x`` on its side of
    the mean, Q(|x - mean| / std). The mirror step is NAB's, kept for identical rounding."""
    if x < mean:
        x = 2 * mean - x
    return 0.5 * math.erfc((x - mean) / std / _SQRT2)


class _Window:
    """The last ``size`` values in a ring buffer, summarised every ``step`` values once full
    (before that, after every value): NAB's windowedGaussian schedule."""

    def __init__(self, size: int, step: int) -> None:
        if size < 1 or step < 1:
            raise ValueError("window and step must be positive")
        self.size, self.step = size, step
        self.values = np.zeros(size, np.float64)
        self.count = 0     # values in the window (<= size)
        self.start = 0     # ring position of the oldest value
        self.pending: list[float] = []

    def push(self, value: float) -> bool:
        """Add a value; True when the summary must be refreshed."""
        if self.count < self.size:
            self.values[self.count] = value
            self.count += 1
            return True
        self.pending.append(value)
        if len(self.pending) < self.step:
            return False
        # Slide by ``step`` at once, as NAB does: the oldest values make way for the buffer.
        for v in self.pending:
            self.values[self.start] = v
            self.start = (self.start + 1) % self.size
        self.pending.clear()
        return True

    def ordered(self) -> np.ndarray:
        """The window oldest first (NAB sums in that order, so the mean rounds the same)."""
        if self.count < self.size:
            return self.values[: self.count]
        return np.roll(self.values, -self.start)

    @property
    def items(self) -> int:
        return self.count + len(self.pending)


class WindowedGaussian:
    """NAB's windowedGaussian: defaults are NAB's (a 6400-value window, refreshed every 100)."""

    def __init__(self, window: int = 6400, step: int = 100) -> None:
        self._window = _Window(window, step)
        self.mean, self.std = 0.0, 1.0
        self.reason = "far from the window's mean"

    def update(self, t: float, value: float) -> float:
        if not math.isfinite(value):
            return 0.0
        score = 0.0
        if self._window.count:
            score = 1.0 - normal_probability(value, self.mean, self.std)
        if self._window.push(value):
            data = self._window.ordered()
            self.mean = float(np.mean(data))
            self.std = float(np.std(data)) or _MIN_STD
        return score

    @property
    def memory_items(self) -> int:
        return self._window.items


def robust_z(score: float) -> float:
    """|z| from a ``RobustZScore`` score (inf for 1.0)."""
    return score / (1.0 - score) if score < 1.0 else math.inf


class RobustZScore:
    """|z| / (1 + |z|) for the robust z-score (value - median) / (1.4826 * MAD) over the last
    ``window`` values (refreshed every ``step``; scored from ``warmup`` values on)."""

    def __init__(self, window: int = 288, step: int = 1, warmup: int = 30) -> None:
        self._window = _Window(window, step)
        self.warmup = min(warmup, window)
        self.median, self.scale = 0.0, 1.0
        self.reason = "far from the window's median"

    def update(self, t: float, value: float) -> float:
        if not math.isfinite(value):
            return 0.0
        score = 0.0
        if self._window.count >= self.warmup:
            z = abs(value - self.median) / self.scale
            score = z / (1.0 + z)
        if self._window.push(value):
            data = self._window.values[: self._window.count]  # order does not matter here
            self.median = float(np.median(data))
            dev = np.abs(data - self.median)
            # A window that is mostly one value has MAD 0: fall back to the mean absolute
            # deviation, which still sees the rare other values, then to NAB's floor.
            scale = _MAD_TO_STD * float(np.median(dev))
            self.scale = scale or _MEAN_AD_TO_STD * float(np.mean(dev)) or _MIN_STD
        return score

    @property
    def memory_items(self) -> int:
        return self._window.items


class SeasonalResidual:
    """Score ``value - value one period earlier`` with an inner detector.

    The earlier value is the last point at or before ``t - period`` if it lies within
    ``tolerance`` seconds of it (default: 1/48 of the period, 30 minutes for a day); without
    one (the first period, gaps) the point scores 0 and the inner detector does not see it.
    At most ``max_points`` points of history are kept: a series sampled faster than
    ``period / max_points`` falls back to scoring 0 (bounded memory wins).
    """

    def __init__(self, inner: WindowedGaussian | RobustZScore, period: float = 86_400.0,
                 tolerance: float | None = None, max_points: int = 4096) -> None:
        self.inner = inner
        self.period = period
        self.tolerance = period / 48 if tolerance is None else tolerance
        self._history: deque[tuple[float, float]] = deque(maxlen=max_points)
        self.reason = f"unlike one period earlier ({inner.reason})"

    def update(self, t: float, value: float) -> float:
        if not math.isfinite(value):
            return 0.0
        history = self._history
        target = t - self.period
        # Keep one point at or before the target: the candidate for this and later points.
        while len(history) > 1 and history[1][0] <= target:
            history.popleft()
        score = 0.0
        if history and target - self.tolerance <= history[0][0] <= target:
            score = self.inner.update(t, value - history[0][1])
        history.append((t, value))
        return score

    @property
    def memory_items(self) -> int:
        return len(self._history) + self.inner.memory_items

"""The streaming detector flags level shifts, spikes and variance changes when they start, stays
quiet on stationary noise, never looks ahead, and keeps bounded state per series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aiops.analytics.anomaly import (
    Anomaly,
    DetectorConfig,
    MultiSeriesDetector,
    SeriesDetector,
)

# Pure computation (no servers, no timing): `make test` runs it at idle priority.
pytestmark = pytest.mark.offline

THRESHOLD = DetectorConfig().threshold
WARMUP = 1000  # points a new series needs before its range and patterns are learnt
CHANGE = 3000


def scores(values: np.ndarray, config: DetectorConfig | None = None) -> np.ndarray:
    detector = SeriesDetector(config)
    return np.array([detector.update(float(i), float(v)) for i, v in enumerate(values)])


def daily_noisy(n: int, seed: int) -> np.ndarray:
    """A metric with a daily cycle (288 points a day) and Gaussian noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 50 + 10 * np.sin(2 * np.pi * t / 288) + rng.normal(0, 1.0, n)


def alarms(s: np.ndarray) -> np.ndarray:
    return np.flatnonzero(s >= THRESHOLD)


def false_alarms_before_change(found: np.ndarray) -> int:
    return sum(1 for i in found if WARMUP <= i < CHANGE)


def test_a_level_shift_is_flagged_when_it_starts() -> None:
    x = daily_noisy(4000, seed=1)
    x[CHANGE:] += 30
    found = alarms(scores(x))
    assert any(CHANGE <= i < CHANGE + 5 for i in found)
    assert false_alarms_before_change(found) <= 2  # at most one per 1,000 points


def test_a_single_spike_is_flagged_on_the_spike() -> None:
    x = daily_noisy(4000, seed=2)
    x[CHANGE] += 40
    found = alarms(scores(x))
    assert CHANGE in found
    assert false_alarms_before_change(found) <= 2


def test_a_variance_increase_is_flagged_soon_after_it_starts() -> None:
    x = daily_noisy(4000, seed=3)
    rng = np.random.default_rng(30)
    x[CHANGE:] += rng.normal(0, 8.0, len(x) - CHANGE)
    found = alarms(scores(x))
    assert any(CHANGE <= i < CHANGE + 50 for i in found)
    assert false_alarms_before_change(found) <= 2


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_stationary_noise_raises_almost_no_alarms(seed: int) -> None:
    x = daily_noisy(10_000, seed=seed)
    found = alarms(scores(x))
    # After the warm-up: at most one alarm per 1,000 points of noise around a daily cycle.
    assert len([i for i in found if i >= WARMUP]) <= 9


def test_an_incident_is_reported_once_not_on_every_point() -> None:
    x = daily_noisy(4000, seed=7)
    x[CHANGE:CHANGE + 10] += 40
    found = alarms(scores(x))
    assert len([i for i in found if CHANGE <= i < CHANGE + 10]) == 1


def test_scores_use_no_future_points() -> None:
    x = daily_noisy(3000, seed=8)
    x[2000] += 25
    whole = scores(x)
    prefix = scores(x[:2100])
    assert np.array_equal(whole[:2100], prefix)
    assert ((whole >= 0) & (whole <= 1)).all()


def test_memory_stays_bounded_on_long_and_noisy_series() -> None:
    config = DetectorConfig(replay=200, range_window=500, max_contexts=1500)
    detector = SeriesDetector(config)
    rng = np.random.default_rng(9)
    sizes = []
    for i, v in enumerate(rng.normal(0, 1, 12_000)):
        detector.update(float(i), float(v))
        if i in (6_000, 11_999):
            sizes.append(detector.memory_items)
    # Values kept + range queues + contexts (a full memory stops learning new ones).
    bound = config.replay + 2 * config.range_window + config.max_contexts
    assert max(sizes) <= bound
    assert detector.memory_items >= config.max_contexts  # noise does fill the context memory


def test_points_that_are_not_finite_or_out_of_order_are_ignored() -> None:
    detector = SeriesDetector()
    for i in range(100):
        detector.update(float(i), 1.0 + (i % 7))
    before = detector.count
    assert detector.update(100.0, math.nan) == 0.0
    assert detector.update(101.0, math.inf) == 0.0
    assert detector.update(50.0, 3.0) == 0.0  # older than the last point
    assert detector.count == before


def test_series_are_tracked_separately_and_anomalies_are_typed() -> None:
    multi = MultiSeriesDetector()
    quiet, spiky = ("latency_p99", "svc=a"), ("latency_p99", "svc=b")
    flat = daily_noisy(2000, seed=10)
    found: list[Anomaly] = []
    for i, v in enumerate(flat):  # same values for both; only one of them spikes
        spike = 60.0 if i == 1500 else 0.0
        for series, value in ((quiet, v), (spiky, v + spike)):
            record = multi.observe(series, float(i), float(value))
            if record is not None and i >= WARMUP:
                found.append(record)
    at_spike = [a for a in found if a.time == 1500.0]
    assert [a.series for a in at_spike] == [spiky]  # the other series' state never saw it
    assert at_spike[0].score >= THRESHOLD
    assert at_spike[0].reason == "outside its recent range"
    assert len(multi) == 2


def test_the_least_recently_updated_series_are_forgotten() -> None:
    multi = MultiSeriesDetector(max_series=2)
    for name in ("a", "b", "a", "c"):
        multi.update(name, 0.0, 1.0)
    assert len(multi) == 2


def test_configuration_is_validated() -> None:
    with pytest.raises(ValueError, match="bits"):
        DetectorConfig(bits=0)
    with pytest.raises(ValueError, match="positive"):
        DetectorConfig(replay=0)

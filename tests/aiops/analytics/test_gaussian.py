"""The windowed Gaussian is NAB's reference detector exactly; every streaming metric detector
scores from the past only and holds bounded state; the live rule alerts once per incident."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from aiops.analytics.anomaly import Anomaly, MultiSeriesDetector
from aiops.analytics.gaussian import (
    RobustZScore,
    SeasonalResidual,
    WindowedGaussian,
    normal_probability,
    robust_z,
)
from aiops.analytics.metric_live import (
    LIVE_DEFAULT,
    MethodSpec,
    Quieted,
    live_detector,
    live_multi_detector,
    spike_score,
)
from aiops_harness.evals import nab
from aiops_harness.evals.nab_events import detections

# Pure computation (no servers, no timing): `make test` runs it at idle priority.
pytestmark = pytest.mark.offline

NAB = Path(__file__).resolve().parents[3].parent / "shared" / "datasets" / "nab"
needs_nab = pytest.mark.skipif(not (NAB / "data").is_dir(), reason=f"NAB not found at {NAB}")

CHEAP = [MethodSpec("gaussian", (("window", 300), ("step", 10))),
         MethodSpec("robust", (("window", 200), ("step", 1))),
         MethodSpec("seasonal_robust", (("window", 200), ("step", 5), ("period", 100))),
         MethodSpec("seasonal_gaussian", (("window", 300), ("step", 10), ("period", 100)))]


def run(detector: object, values: np.ndarray, times: np.ndarray | None = None) -> np.ndarray:
    update = detector.update  # type: ignore[attr-defined]
    ts = np.arange(len(values), dtype=float) if times is None else times
    return np.array([update(float(t), float(v)) for t, v in zip(ts, values, strict=True)])


def noisy(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50 + 10 * np.sin(2 * np.pi * np.arange(n) / 100) + rng.normal(0, 1.0, n)


def test_the_tail_probability_is_nabs() -> None:
    assert normal_probability(0.0, 0.0, 1.0) == 0.5
    assert normal_probability(3.0, 0.0, 1.0) == pytest.approx(0.0013499, abs=1e-7)
    assert normal_probability(-3.0, 0.0, 1.0) == normal_probability(3.0, 0.0, 1.0)


def test_the_windowed_gaussian_follows_nabs_schedule() -> None:
    detector = WindowedGaussian(window=4, step=2)
    got = run(detector, np.array([1.0, 3.0, 5.0, 7.0, 100.0, 101.0, 9.0]))
    assert got[0] == 0.0  # an empty window scores nothing
    assert got[1] == 1.0  # one value: NAB's floor of 1e-6 for the standard deviation
    assert got[2] == pytest.approx(1 - normal_probability(5.0, 2.0, 1.0))
    # Full at 4 values: the next value waits in the step buffer, the statistics stay put.
    assert (detector.mean, detector.std) == (np.mean([100.0, 101.0, 5.0, 7.0]),
                                             np.std([5.0, 7.0, 100.0, 101.0]))
    assert detector.memory_items == 5


@needs_nab
@pytest.mark.parametrize("rel", ["realKnownCause/nyc_taxi.csv",
                                 "artificialNoAnomaly/art_flatline.csv",
                                 "realTweets/Twitter_volume_AAPL.csv"])
def test_the_windowed_gaussian_reproduces_nabs_saved_scores(rel: str) -> None:
    data = nab.read_series(NAB / "data" / rel)
    ours = nab.detect(data["timestamp"], data["value"].astype(float), WindowedGaussian)
    category, file = rel.split("/")
    saved = nab.read_series(NAB / "results" / "windowedGaussian" / category /
                            f"windowedGaussian_{file}.gz", ("anomaly_score",))["anomaly_score"]
    # NAB saved 12 significant digits.
    assert np.abs(ours - saved).max() < 1e-9


@pytest.mark.parametrize("spec", CHEAP, ids=lambda s: s.key)
def test_scores_use_no_future_points(spec: MethodSpec) -> None:
    x = noisy(1500, seed=1)
    changed = x.copy()
    changed[1000:] += np.random.default_rng(2).normal(0, 50, 500)
    whole, other = run(spec.build(), x), run(spec.build(), changed)
    assert np.array_equal(whole[:1000], other[:1000])
    assert ((whole >= 0) & (whole <= 1)).all()


@pytest.mark.parametrize("spec", CHEAP, ids=lambda s: s.key)
def test_memory_stays_bounded(spec: MethodSpec) -> None:
    detector = spec.build()
    sizes = []
    for i, v in enumerate(noisy(5000, seed=3)):
        detector.update(float(i), float(v))
        sizes.append(detector.memory_items)  # type: ignore[attr-defined]
    assert max(sizes[2000:]) == max(sizes[4000:]) <= 300 + 10 + 101


def test_the_robust_z_score_is_not_fooled_by_earlier_outliers() -> None:
    x = np.random.default_rng(4).normal(0, 1, 600)
    x[100:130] = 1000.0  # an old incident inflates a standard deviation, not a MAD
    x[500] = 8.0
    robust = run(RobustZScore(window=400), x)
    gauss = run(WindowedGaussian(window=400, step=1), x)
    assert robust_z(robust[500]) > 6
    assert gauss[500] < 1 - normal_probability(3.0, 0.0, 1.0)  # |z| < 3 for the mean and std


def test_a_flat_series_that_moves_is_anomalous_for_the_robust_z_score() -> None:
    x = np.r_[np.full(100, 5.0), 6.0]
    assert robust_z(run(RobustZScore(window=50), x)[-1]) == pytest.approx(1e6)  # floor 1e-6


def test_the_seasonal_residual_compares_with_one_period_earlier() -> None:
    rng = np.random.default_rng(9)
    x = 10 * np.sin(2 * np.pi * np.arange(1000) / 100) + rng.normal(0, 0.1, 1000)  # 100 s
    x[900] += 5.0
    detector = SeasonalResidual(RobustZScore(window=100, warmup=10), period=100.0)
    got = run(detector, x)
    assert (got[:100] == 0).all()  # nothing a period earlier yet
    # The cycle's swing (20) is 4x the spike, but not one period apart.
    assert robust_z(got[900]) > 10 > 5 > np.max([robust_z(g) for g in got[200:900]])
    # Gaps: no point within the tolerance of t - period scores 0.
    gap = SeasonalResidual(RobustZScore(window=100, warmup=1), period=100.0, tolerance=1.0)
    assert run(gap, np.ones(3), np.array([0.0, 150.0, 250.0]))[2] == 0.0


def test_the_quiet_rule_matches_the_batch_rule_used_to_score() -> None:
    raw = np.random.default_rng(5).uniform(0, 1, 2000)

    class Replay:
        def __init__(self) -> None:
            self.i = -1

        def update(self, t: float, value: float) -> float:
            self.i += 1
            return float(raw[self.i])

    for quiet in (0, 1, 20):
        live = run(Quieted(Replay(), 0.97, quiet), np.zeros(len(raw)))
        assert np.array_equal(np.flatnonzero(live >= 0.97), detections(raw, 0.97, quiet))


def test_the_quiet_rule_ignores_bad_points() -> None:
    q = Quieted(WindowedGaussian(), 0.99, 0)
    q.update(1.0, 1.0)
    assert q.update(2.0, math.nan) == 0.0
    assert q.update(0.5, 1.0) == 0.0
    assert q.count == 1


def test_the_live_detector_reports_a_level_shift_once() -> None:
    x = noisy(4000, seed=6)
    x[3000:] += 100
    scores = run(live_detector(), x)
    found = np.flatnonzero(scores >= LIVE_DEFAULT.threshold)
    assert any(3000 <= i < 3005 for i in found)
    assert len([i for i in found if 3000 <= i < 3000 + LIVE_DEFAULT.quiet]) == 1


def test_the_live_multi_detector_keeps_series_apart_and_bounded() -> None:
    multi = live_multi_detector(max_series=2)
    base = noisy(3000, seed=7)
    found: list[Anomaly] = []
    for i, v in enumerate(base):
        spike = 500.0 if i == 2500 else 0.0
        for series, value in (("kv_cache_usage", v), ("queue_depth", v + spike)):
            record = multi.observe(series, float(i), float(value))
            if record is not None and i == 2500:
                found.append(record)
    assert [a.series for a in found] == ["queue_depth"]
    assert found[0].reason
    for name in ("token_rate", "replica_rss"):
        multi.update(name, 0.0, 1.0)
    assert len(multi) == 2


def test_a_factory_can_replace_the_default_detector() -> None:
    multi = MultiSeriesDetector(factory=WindowedGaussian, threshold=0.999)
    assert multi.observe("a", 0.0, 1.0) is None
    assert multi.threshold == 0.999


def test_unknown_methods_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        MethodSpec("prophet")


def test_cad_with_spikes_is_the_larger_of_its_independent_members() -> None:
    x = noisy(1200, seed=8)
    x[1100] += 30  # inside the range seen (the cycle spans 40), far from the recent median
    both = run(MethodSpec("cad_spike", (("z", 10), ("window", 288), ("step", 1))).build(), x)
    cad = run(MethodSpec("cad").build(), x)
    tails = run(RobustZScore(window=288, step=1), x)
    assert np.array_equal(both, np.maximum(cad, [spike_score(s, 10) for s in tails]))
    assert both[1100] >= 0.8


def test_the_spike_score_rises_with_the_robust_z() -> None:
    assert robust_z(0.75) == pytest.approx(3.0)
    assert spike_score(0.75, 10) == 0.0
    assert spike_score(10.01 / 11.01, 10) == pytest.approx(0.8, abs=1e-3)
    assert spike_score(15 / 16, 10) == pytest.approx(0.9)
    assert spike_score(1.0, 10) == 1.0

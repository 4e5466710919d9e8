"""The NAB scorer scores as numenta/NAB does, re-scores the saved reference detectors to the
published scoreboard, and our streaming detector reaches its recorded NAB score."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from aiops_harness.datasets import DATASETS as HARNESS_DATASETS
from aiops_harness.evals import nab, nab_score

ROOT = HARNESS_DATASETS / "nab"
needs_nab = pytest.mark.skipif(not (ROOT / "data").is_dir(),
                               reason=f"NAB dataset not found at {ROOT}")

STANDARD = nab_score.CostMatrix(tp=1.0, fp=0.11, fn=1.0)
FLAT = nab_score.CostMatrix(tp=1.0, fp=1.0, fn=1.0)
MAX_TP = 2 / (1 + math.exp(-5)) - 1  # scaled sigmoid at a window's left edge


def stamps(n: int) -> np.ndarray:
    return np.datetime64("2024-01-01T00:00", "ns") + np.arange(n) * np.timedelta64(5, "m")


def score_one(detections: list[int], n: int = 100, window: tuple[int, int] | None = (40, 49),
              cost: nab_score.CostMatrix = FLAT, probation: float = 0.0
              ) -> nab_score.ThresholdScore:
    """Score detections (row indices) in a file of ``n`` rows with at most one window."""
    ts = stamps(n)
    anomaly = np.zeros(n)
    anomaly[detections] = 1.0
    windows = [(ts[window[0]], ts[window[1]])] if window else []
    sweep = nab_score.sweep_file("f.csv", ts, anomaly, windows, cost, probation)
    return nab_score.score_file(sweep, 0.5, cost)


# -- the scoring function ------------------------------------------------------------------


def test_scaled_sigmoid_is_nabs_curve() -> None:
    assert nab_score.scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert nab_score.scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert nab_score.scaled_sigmoid(0.0) == 0.0
    assert nab_score.scaled_sigmoid(1.0) == pytest.approx(-0.98661, abs=1e-5)
    assert nab_score.scaled_sigmoid(3.5) == -1.0


def test_probation_is_15_percent_of_the_file_capped_at_750_rows() -> None:
    assert nab_score.probationary_length(4032) == 604
    assert nab_score.probationary_length(22695) == 750.0


def test_no_windows_and_no_detections_score_zero() -> None:
    assert score_one([], window=None).score == 0.0


def test_a_missed_window_costs_the_false_negative_weight() -> None:
    result = score_one([])
    assert result.score == -1.0
    assert (result.tp, result.fn) == (0, 10)


def test_a_detection_at_the_left_edge_earns_the_full_true_positive_weight() -> None:
    assert score_one([40]).score == pytest.approx(1.0)


def test_only_the_earliest_detection_in_a_window_counts() -> None:
    earliest = score_one([45]).score
    assert score_one([45, 47, 49]).score == pytest.approx(earliest)
    # position -(49 - 45 + 1) / 10 = -0.5, normalised by the left edge's score
    assert earliest == pytest.approx(nab_score.scaled_sigmoid(-0.5) / MAX_TP)
    assert score_one([45, 47, 49]).tp == 3


def test_false_positives_before_any_window_cost_the_full_weight() -> None:
    assert score_one([3, 10], cost=STANDARD).score == pytest.approx(-1.0 - 2 * 0.11)


def test_false_positives_right_after_a_window_cost_less_than_later_ones() -> None:
    # Distances are relative to the window width less one: row 50 is 1/9 past row 49.
    soon = score_one([40, 50]).score - 1.0
    late = score_one([40, 90]).score - 1.0
    assert soon == pytest.approx(nab_score.scaled_sigmoid(1 / 9))
    assert late == -1.0  # more than 3 widths past the window
    assert soon > late


def test_probationary_rows_are_not_scored() -> None:
    result = score_one([5, 40], probation=0.15)  # rows 0..14 are probationary
    assert result.score == pytest.approx(1.0)
    assert result.fp == 0


def test_the_sweep_tries_every_score_and_keeps_the_best_threshold() -> None:
    ts = stamps(100)
    anomaly = np.zeros(100)
    anomaly[[10, 20]] = 0.9   # two false positives
    anomaly[40] = 0.6         # the window's first row
    sweep = nab_score.sweep_file("f.csv", ts, anomaly, [(ts[40], ts[49])], STANDARD, 0.0)
    rows = nab_score.scores_by_threshold([sweep], STANDARD)
    assert [r.threshold for r in rows] == [1.1, 0.9, 0.6, 0.0]
    assert rows[0].score == -1.0  # nothing detected: one missed window
    best = nab_score.optimize_threshold([sweep], STANDARD)
    assert best.threshold == 0.6
    assert best.score == pytest.approx(1.0 - 2 * 0.11)
    assert nab_score.score_file(sweep, best.threshold, STANDARD).score == pytest.approx(best.score)


def test_scores_are_normalised_between_the_null_and_the_perfect_detector() -> None:
    assert nab_score.normalized(-116.0, -116.0, 116.0) == 0.0
    assert nab_score.normalized(116.0, -116.0, 116.0) == 100.0
    assert nab_score.normalized(46.6345, -116.0, 116.0) == pytest.approx(70.1, abs=0.01)


def test_windows_must_start_and_end_on_rows() -> None:
    ts = stamps(10)
    with pytest.raises(ValueError, match="does not start and end on rows"):
        nab_score.sweep_file("f.csv", ts, np.zeros(10),
                             [(ts[2], ts[2] + np.timedelta64(1, "m"))], STANDARD)


def test_the_scoreboard_is_read_with_its_ranges(tmp_path: Path) -> None:
    board = tmp_path / "board.md"
    board.write_text("intro\n\n| Detector | Standard | Low FP | Low FN |\n|---|---|---|---|\n"
                     "| Perfect | 100.0 | 100.0 | 100.0 |\n"
                     "| [Numenta HTM](https://x)* | 70.5-69.7 | 62.6-61.7 | 75.2-74.2 |\n"
                     "| Null | 0.0 | 0.0 | 0.0 |\n\nlater\n| A | B | C | D |\n| x | 1 | 2 | 3 |\n")
    rows = nab.read_scoreboard(board)
    assert [r.detector for r in rows] == ["Perfect", "Numenta HTM", "Null"]
    assert rows[1].standard == (69.7, 70.5)


# -- against NAB's own results --------------------------------------------------------------


@needs_nab
def test_our_scorer_matches_nabs_saved_per_file_scores_at_nabs_thresholds() -> None:
    """NAB saved each file's score for the HTM detector at the threshold its optimiser chose;
    re-scoring the saved anomaly scores at those thresholds gives the same totals and counts."""
    profiles = nab.load_profiles(ROOT)
    windows = nab.load_windows(ROOT)
    for profile, cost in profiles.items():
        path = ROOT / "results" / "numenta" / f"numenta_{profile}_scores.csv.gz"
        text = gzip.decompress(path.read_bytes()).decode()
        lines = [line.split(",") for line in text.splitlines()[1:]]
        expected = {row[2]: row for row in lines if row[0] != "Totals"}
        total = 0.0
        for rel, row in expected.items():
            ts = nab.read_series(ROOT / "data" / rel, ("timestamp",))["timestamp"].astype(
                "datetime64[ns]")
            category, file = rel.split("/")
            saved = nab.read_series(ROOT / "results" / "numenta" / category /
                                    f"numenta_{file}.gz", ("anomaly_score",))["anomaly_score"]
            sweep = nab.sweep_file(rel, ts, saved.astype(float), windows[rel], cost)
            got = nab.score_file(sweep, float(row[3]), cost)
            assert got.score == pytest.approx(float(row[4]), abs=1e-6), rel
            assert [got.tp, got.tn, got.fp, got.fn] == [int(x) for x in row[5:9]], rel
            total += got.score
        totals = next(row for row in lines if row[0] == "Totals")
        assert total == pytest.approx(float(totals[4]), abs=1e-6)


@pytest.mark.slow
@needs_nab
@pytest.mark.parametrize("detector", ["numenta", "windowedGaussian", "null"])
def test_reference_detectors_rescore_to_the_published_scoreboard(detector: str) -> None:
    board = nab.read_scoreboard(ROOT.parent / "published" / "NAB_README_scoreboard.md")
    published = nab.published_for(board, detector)
    assert published is not None
    scores = nab.reference_scores(ROOT, detector)
    lo, hi = published.standard
    assert lo - 0.1 <= scores["standard"].score <= hi + 0.1


# -- our detector ----------------------------------------------------------------------------

# What the full run measured (see the module docstring of aiops_harness.evals.nab), less a margin.
RECORDED = {"standard": 71.5, "reward_low_FP_rate": 61.6, "reward_low_FN_rate": 76.7}
MARGIN = 0.5


@pytest.fixture(scope="module")
def report() -> nab.NabReport:
    return nab.run_nab(ROOT)


@pytest.mark.slow
@needs_nab
def test_every_series_goes_through_metric_points_and_the_detector(report: nab.NabReport
                                                                  ) -> None:
    assert report.files == len(nab.data_files(ROOT)) == 58
    assert report.rows == 365_558


@pytest.mark.slow
@needs_nab
@pytest.mark.parametrize("profile", sorted(RECORDED))
def test_our_detector_keeps_its_recorded_nab_score(report: nab.NabReport, profile: str) -> None:
    assert report.ours[profile].score >= RECORDED[profile] - MARGIN


@pytest.mark.slow
@needs_nab
def test_the_report_shows_our_scores_beside_the_published_ones(report: nab.NabReport) -> None:
    text = nab.render(report)
    assert "ours" in text
    assert "ARTime" in text and "74.9" in text  # read from the scoreboard file
    assert f"{report.ours['standard'].score:.1f}" in text

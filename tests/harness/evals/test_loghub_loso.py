"""Leave-one-system-out: a held-out system never takes part in choosing its own setting, ties
are broken as documented, and on the real corpus the miner's defaults are the frozen choice."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from rich.console import Console

from aiops_harness.datasets import DATASETS as HARNESS_DATASETS
from aiops_harness.evals.loghub_loso import (
    GRID,
    TIE,
    Cell,
    Setting,
    choose,
    describe,
    loso,
    render_loso,
    run_loso,
    score_grid,
    template_ratio,
)

REPO = Path(__file__).resolve().parents[3]
CORPUS = HARNESS_DATASETS / "loghub2k"

A = Setting(0.5, 4, 3, 1.0, None)
B = Setting(0.6, 4, 0, 1.0, 0.8)
C = Setting(0.6, 5, 2, 2.0, None)


def cell(ga: float, found: int = 10, true: int = 10) -> Cell:
    return Cell(ga, ga, found, true)


# -- helpers ---------------------------------------------------------------------------------


def test_template_ratio_is_predicted_over_true_distinct_templates() -> None:
    truth = ["a", "a", "b", "b"]
    assert template_ratio(truth, ["x", "y", "z", "z"]) == 1.5  # over-split
    assert template_ratio(truth, ["x"] * 4) == 0.5  # over-merged
    assert cell(1.0, found=30, true=10).ratio == 3.0


def test_the_grid_is_small_explicit_and_holds_the_miners_defaults() -> None:
    assert 10 <= len(GRID) <= 60
    assert len(set(GRID)) == len(GRID)
    assert Setting.default() in GRID
    assert Setting.default().miner() is not None


def test_score_grid_runs_every_setting_on_every_system_once() -> None:
    corpus = {"S": (["Worker 3 started", "Worker 4 started"], ["Worker <*> started"] * 2),
              "T": (["ready"], ["ready"])}
    scores = score_grid(corpus, [A, B])
    assert {s: len(cells) for s, cells in scores.items()} == {"S": 2, "T": 2}
    assert scores["S"][0] == Cell(1.0, 1.0, 1, 1)


# -- choosing --------------------------------------------------------------------------------


def test_the_held_out_system_never_takes_part_in_its_own_choice() -> None:
    grid = [A, B, C]
    scores = {"X": [cell(0.9), cell(0.5), cell(0.7)],
              "Y": [cell(0.8), cell(0.6), cell(0.7)],
              "Z": [cell(0.1), cell(0.2), cell(0.3)]}
    report = loso(scores, grid)
    z = report.fold("Z")
    assert z.held_out not in z.chosen_on and set(z.chosen_on) == {"X", "Y"}
    assert z.setting == A  # best on X and Y, although C is best on Z itself
    # Whatever Z's own scores are, its fold chooses the same.
    for poisoned in ([cell(0.0), cell(1.0), cell(1.0)], [cell(1.0), cell(0.0), cell(0.0)]):
        assert loso({**scores, "Z": poisoned}, grid).fold("Z").setting == A
    # The held-out figures are that setting's, beside the range over the whole grid.
    assert z.score == scores["Z"][0]
    assert z.ga_range == (0.1, 0.3)
    assert z.train_ga == pytest.approx(0.85)


def test_choose_reads_only_the_systems_it_is_given() -> None:
    scores = {"X": [cell(0.9), cell(0.5)], "Y": [cell(0.1), cell(1.0)]}
    assert choose(scores, ["X"]) == 0
    assert choose(scores, ["Y"]) == 1
    with pytest.raises(ValueError):
        choose(scores, [])


def test_ties_go_first_to_the_lowest_similarity_threshold() -> None:
    # Against over-splitting: among settings the systems cannot tell apart, the one that
    # merges most, even over template counts nearer the truth.
    grid = [Setting(0.6, 4, 3, 1.0, 0.8), Setting(0.4, 4, 3, 1.0, 0.8),
            Setting(0.5, 4, 3, 1.0, 0.8)]
    scores = {"X": [cell(0.9, found=10), cell(0.9 - TIE / 2, found=12), cell(0.9, found=10)]}
    assert choose(scores, ["X"], grid) == 1
    assert choose(scores, ["X"]) == 0  # without a grid: counts, then order
    # A lower threshold further than TIE below the best is not tied.
    assert choose({"X": [cell(0.9), cell(0.9 - 2 * TIE)]}, ["X"], grid[:2]) == 0


def test_ties_go_to_template_counts_nearest_the_truth_then_to_grid_order() -> None:
    near = 0.9 - TIE / 2
    # Within TIE of the best: the setting whose template count is nearest the truth wins...
    # (nearness is |ln(found / true)|: 9 templates for 10 beat 12, and 30 is far off).
    scores = {"X": [cell(0.9, found=30), cell(near, found=12), cell(near, found=9)]}
    assert abs(math.log(9 / 10)) < abs(math.log(12 / 10))
    assert choose(scores, ["X"]) == 2
    # ...exact ties in both go to the earlier setting...
    assert choose({"X": [cell(0.9), cell(0.9)]}, ["X"]) == 0
    # ...and a setting further than TIE below the best is never tied.
    assert choose({"X": [cell(0.9), cell(0.9 - 2 * TIE, found=10)]}, ["X"]) == 0


def test_the_frozen_setting_is_chosen_on_every_system() -> None:
    scores = {"X": [cell(0.9), cell(0.5)], "Y": [cell(0.1), cell(0.6)]}
    report = loso(scores, [A, B])
    assert report.frozen == B  # mean 0.55 against 0.5
    assert report.frozen_cells() == {"X": scores["X"][1], "Y": scores["Y"][1]}
    with pytest.raises(ValueError, match="two systems"):
        loso({"X": scores["X"]}, [A, B])


# -- end to end ------------------------------------------------------------------------------


def _system(root: Path, name: str, rows: list[tuple[str, str]]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    with (folder / f"{name}_2k.log_structured_corrected.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["LineId", "Content", "EventTemplate"])
        for i, (content, template) in enumerate(rows, 1):
            w.writerow([i, content, template])


def test_run_loso_reports_every_system_and_says_what_was_chosen_on_what(tmp_path: Path
                                                                        ) -> None:
    root = tmp_path / "loghub2k"
    users = ["alice", "bob", "carol", "dave", "erin"]
    _system(root, "Auth", [(f"Invalid user {u} from 10.0.0.{i}", "Invalid user <*> from <*>")
                           for i, u in enumerate(users)])
    _system(root, "Jobs", [(f"job {i} done in {i * 3} ms", "job <*> done in <*> ms")
                           for i in range(5)])
    _system(root, "Boot", [("cupsd startup succeeded", "cupsd startup succeeded"),
                           ("cupsd shutdown succeeded", "cupsd shutdown succeeded")] * 2)
    report = run_loso(root, grid=[A, B])
    assert [f.held_out for f in report.folds] == ["Auth", "Boot", "Jobs"]
    # Chosen on Auth and Jobs, where both score alike: A, the lower threshold (B never
    # enumerates).
    assert report.fold("Boot").score.ga == 1.0
    assert report.fold("Boot").setting == A
    console = Console(width=250, record=True)
    console.print(render_loso(report))
    text = console.export_text()
    assert all(s in text for s in ["Auth", "Boot", "Jobs", "mean (held out)", "frozen default"])
    words = describe(report)
    assert "Boot: sim 0.5 depth 4 enum <=3 x1 join off, chosen on Auth, Jobs" in words
    assert "Frozen default" in words


# -- the real corpus -------------------------------------------------------------------------

# What the protocol measured with GRID (held-out GA per system); the test allows 0.01 below.
HELD_OUT_GA = {
    "Apache": 1.000,
    "BGL": 0.981,
    "HDFS": 1.000,
    "HealthApp": 1.000,
    "Linux": 1.000,  # with ties to the lowest sim_th; 0.812 before (enum <= 2 at sim 0.6)
    "OpenSSH": 1.000,
    "Zookeeper": 0.995,
}


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"Loghub-2.0 2k corpus not found at {CORPUS}")
def test_loghub2k_leave_one_system_out() -> None:
    report = run_loso(CORPUS)
    assert {f.held_out for f in report.folds} == set(HELD_OUT_GA)
    for f in report.folds:
        assert f.held_out not in f.chosen_on and len(f.chosen_on) == len(HELD_OUT_GA) - 1
        assert f.score.ga >= HELD_OUT_GA[f.held_out] - 0.01, f
        assert f.ga_range[0] <= f.score.ga <= f.ga_range[1]
        assert f.drain_ga is not None and f.score.ga >= f.drain_ga, f  # at or above Drain
    # The miner's defaults are the frozen setting, chosen on all seven.
    assert report.frozen == Setting.default()
    assert report.mean_ga >= 0.95

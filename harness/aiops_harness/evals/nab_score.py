"""NAB v1.1's scorer: per-row anomaly scores and labelled windows in, NAB scores out.

Pure functions over arrays; reading the corpus and running detectors on it is
``aiops_harness.evals.nab``'s. It follows numenta/NAB (``nab/sweeper.py``, ``nab/scorer.py``,
``nab/runner.py``):

* Each labelled anomaly has a window of rows. A detection inside a window earns
  ``scaled_sigmoid(position) * tpWeight / scaled_sigmoid(-1)``, where ``position`` runs from -1
  at the window's left edge towards 0 at its right edge; only the best (earliest) detection in
  a window counts. A window with no detection costs ``fnWeight``.
* A detection outside every window costs ``fpWeight`` (before the first window), or
  ``scaled_sigmoid(distance past the previous window / (its width - 1)) * fpWeight`` after one,
  which is milder right behind a window.
* The first ``min(floor(0.15 * rows), 750)`` rows of each file are probationary: ignored.
* One anomaly-score threshold per detector and profile is chosen for the whole corpus by
  sweeping every distinct score (NAB's sweep optimiser), and each file is scored at it.
* Normalised score = ``100 * (raw - null) / (perfect - null)``: ``null`` is the null detector's
  raw score (it detects nothing), ``perfect`` is one earliest detection per window.

Timestamps are matched exactly, as NAB does: a window starts at the row whose timestamp equals
its start, and ends at the row equal to its end. Re-scoring the saved HTM outputs at the
thresholds NAB saved reproduces NAB's per-file scores and counts exactly; the sweep finds a
slightly better reward_low_FP_rate threshold than the hill-climbing optimiser NAB used then
(63.2 rather than the 63.1 of results/final_results.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "PROBATION_PERCENT",
    "CorpusScore",
    "CostMatrix",
    "FileSweep",
    "ThresholdScore",
    "Windows",
    "normalized",
    "null_raw_score",
    "optimize_threshold",
    "perfect_raw_score",
    "probationary_length",
    "scaled_sigmoid",
    "score_corpus",
    "score_file",
    "scores_by_threshold",
    "sweep_file",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

PROBATION_PERCENT = 0.15
# The threshold NAB's sweep starts from: above every score, so nothing is detected.
_START_THRESHOLD = 1.1
# Rows the probation may cover at most (NAB: probationPercent * 5000).
_PROBATION_CAP_ROWS = 5000


@dataclass(frozen=True)
class CostMatrix:
    """A NAB application profile's weights (config/profiles.json)."""

    tp: float
    fp: float
    fn: float


Windows = list[tuple[np.datetime64, np.datetime64]]


# -- the scoring function ------------------------------------------------------------------


def scaled_sigmoid(position: float) -> float:
    """NAB's score for a detection at a relative ``position``: about +0.987 at a window's left
    edge (-1), 0 at its right edge, negative past it, -1 from 3 window-widths on."""
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def _scaled_sigmoid_array(position: FloatArray) -> FloatArray:
    # Clip before exp: beyond 3 the result is -1 anyway, and exp must not overflow.
    value = 2.0 / (1.0 + np.exp(5.0 * np.minimum(position, 3.5))) - 1.0
    return np.where(position > 3.0, -1.0, value)


def probationary_length(rows: int, percent: float = PROBATION_PERCENT) -> float:
    """Rows at the start of a file that are not scored (a float, as in NAB)."""
    return min(math.floor(percent * rows), percent * _PROBATION_CAP_ROWS)


@dataclass(frozen=True)
class FileSweep:
    """One file's scorable rows: each row's anomaly score, the NAB score it would earn if it
    were a detection (``sweep``), and its window (-1: outside every window)."""

    name: str
    anomaly: FloatArray
    sweep: FloatArray
    window: IntArray
    windows: int  # windows with at least one scorable row


def _window_bounds(timestamps: IntArray, windows: Windows, name: str) -> list[tuple[int, int]]:
    bounds = []
    previous_end = -1
    for start, end in windows:
        left = np.flatnonzero(timestamps == start.astype("datetime64[ns]").astype(np.int64))
        right = np.flatnonzero(timestamps == end.astype("datetime64[ns]").astype(np.int64))
        if not len(left) or not len(right):
            raise ValueError(f"{name}: window {start}..{end} does not start and end on rows")
        if int(left[0]) <= previous_end or int(right[0]) < int(left[0]):
            raise ValueError(f"{name}: windows overlap or are out of order")
        bounds.append((int(left[0]), int(right[0])))
        previous_end = int(right[0])
    return bounds


def sweep_file(name: str, timestamps: npt.NDArray[np.datetime64], anomaly: FloatArray,
               windows: Windows, cost: CostMatrix,
               probation_percent: float = PROBATION_PERCENT) -> FileSweep:
    """NAB's ``Sweeper.calcSweepScore``: the score each row would earn as a detection."""
    n = len(timestamps)
    if len(anomaly) != n:
        raise ValueError(f"{name}: {len(anomaly)} anomaly scores for {n} rows")
    ts = timestamps.astype("datetime64[ns]").astype(np.int64)
    index = np.arange(n, dtype=np.float64)
    window = np.full(n, -1, dtype=np.int64)
    # Rows before the first window: as far from any window as can be.
    sweep = np.full(n, -cost.fp, dtype=np.float64)
    max_tp = scaled_sigmoid(-1.0)
    bounds = _window_bounds(ts, windows, name)
    for k, (left, right) in enumerate(bounds):
        width = float(right - left + 1)
        inside = slice(left, right + 1)
        window[inside] = k
        position = -(right - index[inside] + 1.0) / width
        sweep[inside] = _scaled_sigmoid_array(position) * cost.tp / max_tp
        # Rows after this window, up to the next one, are scored by their distance past it.
        following = slice(right + 1, bounds[k + 1][0] if k + 1 < len(bounds) else n)
        with np.errstate(divide="ignore", invalid="ignore"):
            past = np.abs(index[following] - right) / (width - 1.0)
        if width == 1.0 and following.start < following.stop:
            raise ZeroDivisionError(f"{name}: a one-row window is followed by rows (as in NAB)")
        sweep[following] = _scaled_sigmoid_array(past) * cost.fp
    keep = index >= probationary_length(n, probation_percent)
    scored = np.unique(window[keep & (window >= 0)])
    return FileSweep(name, np.asarray(anomaly, dtype=np.float64)[keep], sweep[keep],
                     window[keep], len(scored))


# -- thresholds ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ThresholdScore:
    """NAB's score at one threshold: detections are rows whose anomaly score is >= it."""

    threshold: float
    score: float
    tp: int
    tn: int
    fp: int
    fn: int

    @property
    def total(self) -> int:
        return self.tp + self.tn + self.fp + self.fn


def _concat(sweeps: Sequence[FileSweep]) -> tuple[FloatArray, FloatArray, IntArray, int]:
    """All files' rows together, their windows numbered across the corpus."""
    offsets = np.cumsum([0] + [int(s.window.max(initial=-1)) + 1 for s in sweeps])
    anomaly = np.concatenate([s.anomaly for s in sweeps]) if sweeps else np.zeros(0)
    sweep = np.concatenate([s.sweep for s in sweeps]) if sweeps else np.zeros(0)
    window = (np.concatenate([np.where(s.window >= 0, s.window + off, -1)
                              for s, off in zip(sweeps, offsets, strict=False)])
              if sweeps else np.zeros(0, dtype=np.int64))
    return anomaly, sweep, window.astype(np.int64), int(sum(s.windows for s in sweeps))


def scores_by_threshold(sweeps: Sequence[FileSweep], cost: CostMatrix) -> list[ThresholdScore]:
    """NAB's ``Sweeper.calcScoreByThreshold`` over the given files: the score at the start
    threshold (1.1, nothing detected) and at every distinct anomaly score, highest first."""
    anomaly, sweep, window, n_windows = _concat(sweeps)
    order = np.argsort(-anomaly, kind="stable")
    a, s, w = anomaly[order], sweep[order], window[order]
    in_window = w >= 0
    fp_score = np.cumsum(np.where(in_window, 0.0, s))
    fp_count = np.cumsum(~in_window)
    tp_count = np.cumsum(in_window)
    # A window's part is the best sweep score among its detected rows (-fnWeight while none):
    # a running maximum per window, taken in threshold order; its increments add up.
    gain = np.zeros(len(a))
    rows = np.flatnonzero(in_window)
    if len(rows):
        by_window = rows[np.argsort(w[rows], kind="stable")]
        wid = w[by_window]
        # Offsetting each window by a multiple of 10 (> the score range) makes one running
        # maximum over the whole array restart at every window.
        running = np.maximum.accumulate(s[by_window] + 10.0 * wid) - 10.0 * wid
        first = np.r_[True, wid[1:] != wid[:-1]]
        before = np.where(first, -cost.fn, np.r_[-cost.fn, running[:-1]])
        gain[by_window] = np.maximum(running - before, 0.0)
    total = fp_score + np.cumsum(gain) - cost.fn * n_windows
    n_in, n_out = int(in_window.sum()), int((~in_window).sum())
    rows_out = []
    if not len(a) or a[0] != _START_THRESHOLD:
        rows_out.append(ThresholdScore(_START_THRESHOLD, -cost.fn * n_windows, 0, n_out, 0, n_in))
    # The state after the last row of each run of equal scores belongs to that score.
    ends = np.flatnonzero(np.r_[a[1:] != a[:-1], True]) if len(a) else np.zeros(0, np.int64)
    for i in ends:
        tp, fp = int(tp_count[i]), int(fp_count[i])
        rows_out.append(ThresholdScore(float(a[i]), float(total[i]), tp, n_out - fp, fp,
                                       n_in - tp))
    return rows_out


def optimize_threshold(sweeps: Sequence[FileSweep], cost: CostMatrix) -> ThresholdScore:
    """The corpus-wide threshold with the best total score (ties: the higher threshold), as
    NAB's sweep optimiser picks it."""
    rows = scores_by_threshold(sweeps, cost)
    return rows[int(np.argmax([r.score for r in rows]))]


def score_file(sweep: FileSweep, threshold: float, cost: CostMatrix) -> ThresholdScore:
    """NAB's ``Sweeper.scoreDataSet``: one file's score with detections at ``threshold``."""
    detected = sweep.anomaly >= threshold
    in_window = sweep.window >= 0
    fp_rows = detected & ~in_window
    score = float(sweep.sweep[fp_rows].sum())
    for k in np.unique(sweep.window[in_window]):
        hits = detected & (sweep.window == k)
        score += float(sweep.sweep[hits].max()) if hits.any() else -cost.fn
    tp = int((detected & in_window).sum())
    fp = int(fp_rows.sum())
    return ThresholdScore(threshold, score, tp, int((~in_window).sum()) - fp, fp,
                          int(in_window.sum()) - tp)


# -- the corpus's score --------------------------------------------------------------------


def perfect_raw_score(windows: dict[str, Windows], cost: CostMatrix) -> float:
    """NAB's perfect detector: every labelled window found at its left edge."""
    return cost.tp * sum(len(w) for w in windows.values())


def null_raw_score(sweeps: Sequence[FileSweep], cost: CostMatrix) -> float:
    """The null detector's optimised raw score: it gives every row the same anomaly score."""
    flat = [FileSweep(s.name, np.zeros_like(s.anomaly), s.sweep, s.window, s.windows)
            for s in sweeps]
    return optimize_threshold(flat, cost).score


def normalized(raw: float, null: float, perfect: float) -> float:
    return 100.0 * (raw - null) / (perfect - null)


@dataclass(frozen=True)
class CorpusScore:
    """A detector's NAB result for one profile."""

    profile: str
    threshold: float
    raw: float
    null: float
    perfect: float
    files: dict[str, ThresholdScore]

    @property
    def score(self) -> float:
        return normalized(self.raw, self.null, self.perfect)


def score_corpus(anomaly_scores: dict[str, FloatArray],
                 timestamps: dict[str, npt.NDArray[np.datetime64]],
                 windows: dict[str, Windows], profiles: dict[str, CostMatrix]
                 ) -> dict[str, CorpusScore]:
    """Optimise the threshold per profile over every file, score each file at it, and
    normalise, as ``run.py --optimize --score --normalize`` does."""
    missing = set(windows) - set(anomaly_scores)
    if missing:
        raise ValueError(f"no anomaly scores for {sorted(missing)[:3]}...")
    out = {}
    for profile, cost in profiles.items():
        sweeps = [sweep_file(rel, timestamps[rel], anomaly_scores[rel], windows[rel], cost)
                  for rel in sorted(windows)]
        best = optimize_threshold(sweeps, cost)
        files = {s.name: score_file(s, best.threshold, cost) for s in sweeps}
        raw = sum(f.score for f in files.values())
        out[profile] = CorpusScore(profile, best.threshold, raw, null_raw_score(sweeps, cost),
                                   perfect_raw_score(windows, cost), files)
    return out

"""Event-level scores beside NAB's: detections from raw scores, then F1 over labelled windows.

* **Detections** (``detections``): the alerting rule of ``aiops.analytics.metric_live.Quieted``
  applied to a whole series: row i is a detection when its raw score is >= the threshold, it is
  not among the first ``quiet`` rows, and no row in the ``quiet`` rows before it reached the
  threshold. ``quiet=0`` is every row at or above the threshold (NAB's own rule).
* **Event-level F1** (``EventCounts``): each labelled window is one event; a window with at
  least one detection is a true-positive event, one without a false negative; every detection
  outside all windows is one false positive (counted per detection, after the quiet period:
  each is an alert someone receives). Collapsing runs of consecutive detections instead would
  let a detector that fires on every row score F1 = 1 on NAB, whose windows cover a tenth of
  each file, so it is not done. Precision = TP events / (TP events + FPs), recall = TP events
  / windows. NAB's probationary rows (the first 15 %) are not scored, as in NAB.
* **Point-adjusted F1** (the common KPI-literature score, kept for comparison): every row of a
  detected window counts as detected; FPs as above.

The event-level score is the headline: point adjustment rewards long windows and lets one lucky
detection stand for hundreds of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from aiops_harness.evals.nab_score import (
    CostMatrix,
    FileSweep,
    FloatArray,
    IntArray,
    Windows,
    sweep_file,
)

__all__ = [
    "EventCounts",
    "FileTable",
    "detections",
    "event_counts",
    "file_table",
]


def detections(scores: FloatArray, threshold: float, quiet: int = 0) -> IntArray:
    """Row indices detected at ``threshold`` with a quiet period of ``quiet`` rows."""
    exceed = np.flatnonzero(np.asarray(scores) >= threshold)
    if quiet <= 0 or not len(exceed):
        return exceed.astype(np.int64)
    gap = np.diff(exceed, prepend=-(10**18))
    return exceed[(gap > quiet) & (exceed >= quiet)].astype(np.int64)


@dataclass(frozen=True)
class EventCounts:
    """Event and point-adjusted counts; they add up over files."""

    tp: int = 0            # windows with a detection
    fn: int = 0            # windows without one
    fp: int = 0            # detections outside every window
    pa_tp: int = 0         # rows of detected windows (point-adjusted)
    pa_fn: int = 0         # rows of missed windows

    def __add__(self, other: EventCounts) -> EventCounts:
        return EventCounts(self.tp + other.tp, self.fn + other.fn, self.fp + other.fp,
                           self.pa_tp + other.pa_tp, self.pa_fn + other.pa_fn)

    @staticmethod
    def _f1(tp: int, fp: int, fn: int) -> float | None:
        if tp + fn == 0:
            return None  # no events: F1 is undefined (report the false positives instead)
        return 2 * tp / (2 * tp + fp + fn)

    @property
    def f1(self) -> float | None:
        return self._f1(self.tp, self.fp, self.fn)

    @property
    def pa_f1(self) -> float | None:
        return self._f1(self.pa_tp, self.fp, self.pa_fn)


def event_counts(window: IntArray, detected: IntArray) -> EventCounts:
    """Counts for one file: ``window`` is each scored row's window (-1: none), ``detected``
    the detected rows (indices into the scored rows)."""
    labelled = window[window >= 0]
    sizes = np.bincount(labelled, minlength=int(window.max(initial=-1)) + 1)
    present = np.flatnonzero(sizes)
    w = window[np.asarray(detected, dtype=np.int64)]
    hit = np.unique(w[w >= 0])
    pa_tp = int(sizes[hit].sum())
    return EventCounts(len(hit), len(present) - len(hit), int((w < 0).sum()), pa_tp,
                       int(sizes.sum()) - pa_tp)


@dataclass(frozen=True)
class FileTable:
    """One file's NAB raw score and event counts at each threshold of a sweep."""

    name: str
    raw: FloatArray                 # NAB raw score per threshold
    counts: list[EventCounts]       # per threshold
    windows: int                    # windows with a scored row
    labelled: int                   # windows labelled (NAB's perfect score counts them all)
    null_none: float                # NAB raw score detecting nothing
    null_all: float                 # ... and detecting every row (the null detector's options)
    days: float = 0.0               # time the scored rows span (false alarms per series-day)


def file_table(name: str, timestamps: npt.NDArray[np.datetime64], scores: FloatArray,
               windows: Windows, cost: CostMatrix, thresholds: Sequence[float],
               quiet: int = 0) -> FileTable:
    """Score one file at every threshold: detections by ``detections`` (on all rows, so the
    quiet period runs through the probation), scored on NAB's scored rows only."""
    sweep: FileSweep = sweep_file(name, timestamps, np.zeros(len(timestamps)), windows, cost)
    first = len(timestamps) - len(sweep.sweep)  # the probation is a prefix of the rows
    inside = sweep.window >= 0
    # Inside a window NAB's reward falls with the row, so a window's best detection is its
    # first one.
    none = -cost.fn * sweep.windows
    starts = np.unique(sweep.window[inside], return_index=True)[1]
    every = float(sweep.sweep[~inside].sum() + sweep.sweep[inside][starts].sum())
    raw = np.zeros(len(thresholds))
    counts = []
    for j, threshold in enumerate(thresholds):
        d = detections(scores, threshold, quiet)
        d = d[d >= first] - first
        w = sweep.window[d]
        fp = float(sweep.sweep[d[w < 0]].sum())
        hit_w, hit_at = np.unique(w[w >= 0], return_index=True)
        tp = float(sweep.sweep[d[w >= 0][hit_at]].sum())
        raw[j] = fp + tp - cost.fn * (sweep.windows - len(hit_w))
        counts.append(event_counts(sweep.window, d))
    scored = timestamps[first:]
    days = float((scored[-1] - scored[0]) / np.timedelta64(1, "s")) / 86400 if len(scored) else 0.0
    return FileTable(name, raw, counts, sweep.windows, len(windows), none, every, days)

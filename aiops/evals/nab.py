"""The Numenta Anomaly Benchmark (NAB v1.1): its scorer, and our detector run on its corpus.

The scorer follows numenta/NAB (``nab/sweeper.py``, ``nab/scorer.py``, ``nab/runner.py``):

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

``run_nab`` on NAB v1.1 with the default ``DetectorConfig`` (recorded in the tests):
standard 71.5, reward_low_FP_rate 61.6, reward_low_FN_rate 76.7 (threshold 0.782), against
Numenta HTM 70.1 / 63.2 / 74.3 and Windowed Gaussian 39.6 / 20.9 / 47.4 re-scored here.
Run it with ``python -m aiops.evals.nab [path/to/nab]``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pacsv

from aiops.analytics.anomaly import DetectorConfig, SeriesDetector
from aiops.schema import METRIC_POINTS
from aiops.store import Store

__all__ = [
    "PROBATION_PERCENT",
    "SCOREBOARD_NAMES",
    "CorpusScore",
    "CostMatrix",
    "FileSweep",
    "NabReport",
    "PublishedRow",
    "ThresholdScore",
    "data_files",
    "detect",
    "load_profiles",
    "load_windows",
    "normalized",
    "null_raw_score",
    "optimize_threshold",
    "perfect_raw_score",
    "probationary_length",
    "published_for",
    "read_scoreboard",
    "read_series",
    "reference_detectors",
    "reference_scores",
    "render",
    "run_nab",
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


def load_profiles(root: Path) -> dict[str, CostMatrix]:
    raw = json.loads((root / "config" / "profiles.json").read_text())
    return {name: CostMatrix(tp=p["CostMatrix"]["tpWeight"], fp=p["CostMatrix"]["fpWeight"],
                             fn=p["CostMatrix"]["fnWeight"]) for name, p in raw.items()}


Windows = list[tuple[np.datetime64, np.datetime64]]


def load_windows(root: Path) -> dict[str, Windows]:
    """Anomaly windows per data file ("category/file.csv"), from labels/combined_windows.json."""
    raw = json.loads((root / "labels" / "combined_windows.json").read_text())
    return {rel: [(np.datetime64(a, "ns"), np.datetime64(b, "ns")) for a, b in wins]
            for rel, wins in raw.items()}


def read_series(path: Path, columns: Sequence[str] = ("timestamp", "value")
                ) -> dict[str, npt.NDArray[np.generic]]:
    """Columns of a NAB CSV (data or results file, plain or gzipped) as numpy arrays; the
    timestamp column as datetime64[ns]."""
    opts = pacsv.ConvertOptions(include_columns=list(columns),
                                column_types={"timestamp": pa.timestamp("ns")})
    table = pacsv.read_csv(path, convert_options=opts)
    return {c: table.column(c).to_numpy() for c in columns}


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


# -- the corpus ----------------------------------------------------------------------------


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


def _results_path(root: Path, detector: str, rel: str) -> Path:
    category, file = rel.split("/")
    base = root / "results" / detector / category / f"{detector}_{file}"
    return base if base.exists() else base.with_name(base.name + ".gz")


def reference_detectors(root: Path) -> list[str]:
    """Detectors whose per-row outputs are saved under results/ for every labelled file."""
    rels = list(load_windows(root))
    folder = root / "results"
    names = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    return [d for d in names if all(_results_path(root, d, r).exists() for r in rels)]


def reference_scores(root: Path, detector: str,
                     profiles: dict[str, CostMatrix] | None = None) -> dict[str, CorpusScore]:
    """Re-score a reference detector from its saved per-row anomaly scores."""
    windows = load_windows(root)
    times: dict[str, npt.NDArray[np.datetime64]] = {}
    scores: dict[str, FloatArray] = {}
    for rel in windows:
        stamps = read_series(root / "data" / rel, ("timestamp",))["timestamp"]
        times[rel] = stamps.astype("datetime64[ns]")
        saved = read_series(_results_path(root, detector, rel), ("anomaly_score",))
        scores[rel] = saved["anomaly_score"].astype(np.float64)
    return score_corpus(scores, times, windows, profiles or load_profiles(root))


# -- published numbers ---------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedRow:
    """One scoreboard row: per profile the (low, high) of the published score (equal unless a
    range such as "70.5-69.7" is given)."""

    detector: str
    standard: tuple[float, float]
    reward_low_fp: tuple[float, float]
    reward_low_fn: tuple[float, float]

    def profile(self, name: str) -> tuple[float, float]:
        return {"standard": self.standard, "reward_low_FP_rate": self.reward_low_fp,
                "reward_low_FN_rate": self.reward_low_fn}[name]


_VALUE = re.compile(r"(-?\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")


def _published_value(cell: str) -> tuple[float, float] | None:
    """A score cell: "39.6" -> (39.6, 39.6), a range "70.5-69.7" -> (69.7, 70.5), else None."""
    match = _VALUE.fullmatch(cell.strip())
    if match is None:
        return None
    first = float(match.group(1))
    second = float(match.group(2)) if match.group(2) else first
    return (min(first, second), max(first, second))


def read_scoreboard(path: Path) -> list[PublishedRow]:
    """The rows of the first table in NAB's README scoreboard (markdown)."""
    rows: list[PublishedRow] = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not line.lstrip().startswith("|"):
            if rows:
                break  # the first table has ended
            continue
        values = [_published_value(c) for c in cells[1:]]
        if any(v is None for v in values):
            continue
        name = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cells[0])  # [name](url) -> name
        name = name.replace("&dagger;", "").rstrip("*").strip()
        std, low_fp, low_fn = (v for v in values if v is not None)
        rows.append(PublishedRow(name, std, low_fp, low_fn))
    return rows


# Reference detectors' result folders, as the scoreboard names them.
SCOREBOARD_NAMES = {"numenta": "Numenta HTM", "windowedGaussian": "Windowed Gaussian",
                    "null": "Null", "contextOSE": "CAD OSE", "ARTime": "ARTime",
                    "knncad": "KNN CAD", "earthgeckoSkyline": "earthgecko Skyline"}


def published_for(rows: Sequence[PublishedRow], detector: str) -> PublishedRow | None:
    name = SCOREBOARD_NAMES.get(detector, detector)
    return next((r for r in rows if r.detector == name), None)


# -- our detector on NAB -------------------------------------------------------------------


@dataclass(frozen=True)
class NabReport:
    """Our detector's NAB scores, the reference detectors re-scored, and the scoreboard."""

    ours: dict[str, CorpusScore]
    references: dict[str, dict[str, CorpusScore]]
    published: list[PublishedRow]
    files: int
    rows: int
    detect_seconds: float  # streaming every point through the detector
    load_seconds: float    # CSV -> metric_points -> SQL read-back


def data_files(root: Path) -> list[str]:
    """Every series under root/data, as "category/file.csv"."""
    return sorted(p.relative_to(root / "data").as_posix()
                  for p in (root / "data").glob("*/*.csv"))


def _series_name(rel: str) -> str:
    return f"nab.{rel.removesuffix('.csv')}"


def _load_into_store(store: Store, root: Path, rels: Iterable[str]) -> int:
    """Append every series to metric_points as one gauge per file; return the rows written."""
    tables = []
    for rel in rels:
        data = read_series(root / "data" / rel)
        n = len(data["value"])
        tables.append(pa.table({
            "time": pa.array(data["timestamp"], pa.timestamp("ns")),
            "name": pa.array([_series_name(rel)] * n, pa.string()),
            "type": pa.array(["gauge"] * n, pa.string()),
            "value": pa.array(data["value"], pa.float64()),
        }))
    batch = pa.concat_tables(tables).cast(
        pa.schema([METRIC_POINTS.arrow_schema.field(c) for c in ("time", "name", "type",
                                                                  "value")]))
    return store.append(METRIC_POINTS.name, batch)


def _read_back(store: Store, rel: str) -> tuple[npt.NDArray[np.datetime64], FloatArray]:
    table = store.query_arrow(
        "SELECT time, value FROM metric_points WHERE name = ? AND type = 'gauge' ORDER BY time",
        [_series_name(rel)])
    times = table.column("time").to_numpy().astype("datetime64[ns]")
    return times, table.column("value").to_numpy().astype(np.float64)


def detect(times: npt.NDArray[np.datetime64], values: FloatArray,
           make: Callable[[], SeriesDetector] = SeriesDetector) -> FloatArray:
    """Stream one series through a fresh detector: one score per point, no look-ahead."""
    detector = make()
    seconds = times.astype("datetime64[ns]").astype(np.int64) / 1e9
    update = detector.update
    return np.fromiter((update(t, v) for t, v in zip(seconds.tolist(), values.tolist(),
                                                     strict=True)),
                       np.float64, len(values))


def run_nab(root: Path, config: DetectorConfig | None = None,
            scoreboard: Path | None = None) -> NabReport:
    """Load every NAB series into ``metric_points``, read each back with SQL, stream it
    through ``SeriesDetector`` and score the result as NAB does; re-score the reference
    detectors saved under results/ for comparison."""
    windows = load_windows(root)
    profiles = load_profiles(root)
    rels = [r for r in data_files(root) if r in windows]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nab-") as tmp:
        store = Store(Path(tmp) / "x.duckdb")
        try:
            rows = _load_into_store(store, root, rels)
            series = {rel: _read_back(store, rel) for rel in rels}
        finally:
            store.close()
    loaded = time.perf_counter()
    scores = {rel: detect(t, v, lambda: SeriesDetector(config)) for rel, (t, v) in series.items()}
    detected = time.perf_counter()
    ours = score_corpus(scores, {rel: t for rel, (t, _) in series.items()},
                        {rel: windows[rel] for rel in rels}, profiles)
    references = {d: reference_scores(root, d, profiles) for d in reference_detectors(root)}
    board = scoreboard or root.parent / "published" / "NAB_README_scoreboard.md"
    published = read_scoreboard(board) if board.exists() else []
    return NabReport(ours, references, published, len(rels), rows, detected - loaded,
                     loaded - started)


_PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")


def _cell(score: CorpusScore | None) -> str:
    return "" if score is None else f"{score.score:.1f}"


def _published_cell(row: PublishedRow | None, profile: str) -> str:
    if row is None:
        return ""
    lo, hi = row.profile(profile)
    return f"{lo:.1f}" if lo == hi else f"{hi:.1f}-{lo:.1f}"


def render(report: NabReport) -> str:
    """Markdown: our scores and the re-scored references beside the published scoreboard."""
    head = ("| Detector | Standard | Reward low FP | Reward low FN | Published (std / low FP "
            "/ low FN) |")
    lines = [head, "|---|---|---|---|---|"]

    def row(name: str, scores: dict[str, CorpusScore] | None,
            published: PublishedRow | None) -> str:
        ours = " | ".join(_cell(scores.get(p) if scores else None) for p in _PROFILES)
        pub = " / ".join(_published_cell(published, p) for p in _PROFILES) if published else ""
        return f"| {name} | {ours} | {pub} |"

    lines.append(row("**aiops SeriesDetector (ours)**", report.ours, None))
    for detector, scores in report.references.items():
        lines.append(row(f"{detector} (re-scored)", scores,
                         published_for(report.published, detector)))
    shown = {SCOREBOARD_NAMES.get(d, d) for d in report.references}
    lines.extend(row(p.detector, None, p) for p in report.published if p.detector not in shown)
    std = report.ours["standard"]
    lines += ["", f"{report.files} series, {report.rows} points; detection "
              f"{report.detect_seconds:.1f} s ({1e6 * report.detect_seconds / report.rows:.0f} "
              f"us/point), loading through metric_points {report.load_seconds:.1f} s; "
              f"standard threshold {std.threshold:.4f}, raw {std.raw:.2f} "
              f"(null {std.null:.0f}, perfect {std.perfect:.0f})."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parents[2].parent / "shared" / (
        "datasets/nab")
    print(render(run_nab(root)))


if __name__ == "__main__":
    main()

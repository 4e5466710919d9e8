"""The Numenta Anomaly Benchmark (NAB v1.1): our detector run on its corpus, and the report.

Reads the corpus (data, labels, profiles, the reference detectors' saved results and the
published scoreboard), streams every series through ``SeriesDetector`` and scores it with
``aiops_harness.evals.nab_score``, NAB's scorer, whose names are re-exported here.

``run_nab`` on NAB v1.1 with the default ``DetectorConfig`` (recorded in the tests):
standard 71.5, reward_low_FP_rate 61.6, reward_low_FN_rate 76.7 (threshold 0.782), against
Numenta HTM 70.1 / 63.2 / 74.3 and Windowed Gaussian 39.6 / 20.9 / 47.4 re-scored here.
Run it with ``python -m aiops_harness.evals.nab [path/to/nab]``. Which detector live analytics runs,
and why, is ``aiops_harness.evals.nab_loco``'s (leave-one-category-out over NAB's data families);
the
event-level F1 beside NAB's score is ``aiops_harness.evals.nab_events``'.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pacsv

from aiops.analytics.anomaly import DetectorConfig, MetricDetector, SeriesDetector
from aiops.schema import METRIC_POINTS
from aiops.store import Store
from aiops_harness.datasets import DATASETS
from aiops_harness.evals.nab_score import (
    PROBATION_PERCENT,
    CorpusScore,
    CostMatrix,
    FileSweep,
    FloatArray,
    ThresholdScore,
    Windows,
    normalized,
    null_raw_score,
    optimize_threshold,
    perfect_raw_score,
    probationary_length,
    scaled_sigmoid,
    score_corpus,
    score_file,
    scores_by_threshold,
    sweep_file,
)

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

# -- the corpus ----------------------------------------------------------------------------


def load_profiles(root: Path) -> dict[str, CostMatrix]:
    raw = json.loads((root / "config" / "profiles.json").read_text())
    return {name: CostMatrix(tp=p["CostMatrix"]["tpWeight"], fp=p["CostMatrix"]["fpWeight"],
                             fn=p["CostMatrix"]["fnWeight"]) for name, p in raw.items()}


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
           make: Callable[[], MetricDetector] = SeriesDetector) -> FloatArray:
    """Stream one series through a fresh detector: one score per point, no look-ahead."""
    detector = make()
    seconds = times.astype("datetime64[ns]").astype(np.int64) / 1e9
    update = detector.update
    return np.fromiter((update(t, v) for t, v in zip(seconds.tolist(), values.tolist(),
                                                     strict=True)),
                       np.float64, len(values))


def detect_all(series: dict[str, tuple[npt.NDArray[np.datetime64], FloatArray]],
               make: Callable[[], MetricDetector] = SeriesDetector) -> dict[str, FloatArray]:
    """``detect`` over many series, one process per core (each series' stream is independent
    and pure Python, so threads would not help). ``make`` must pickle (no lambdas)."""
    workers = min(len(series), os.cpu_count() or 1)
    if workers <= 1:
        return {rel: detect(t, v, make) for rel, (t, v) in series.items()}
    # spawn, not fork: the caller may hold DuckDB or server threads, whose locks a forked
    # child would inherit mid-use.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        longest_first = sorted(series, key=lambda rel: -len(series[rel][1]))
        futures = {rel: pool.submit(detect, *series[rel], make) for rel in longest_first}
        return {rel: futures[rel].result() for rel in series}


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
    scores = detect_all(series, functools.partial(SeriesDetector, config))
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
    root = Path(args[0]) if args else DATASETS / "nab"
    print(render(run_nab(root)))


if __name__ == "__main__":
    main()

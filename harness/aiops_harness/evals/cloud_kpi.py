"""Microsoft's Cloud Monitoring Dataset (six KPI families, point labels) as a second metric
corpus, scored under NAB's event protocol (``aiops_harness.evals.nab_events``).

The corpus (``../shared/datasets/cloud_kpi/data/<family>/<series>.csv``: ``TimeStamp,Value,
Label`` per point, hourly or per minute) is read into what the NAB code takes:

* **Series**: timestamps (``...Z`` and naive strings alike, as UTC-naive ``datetime64[ns]``)
  and values. A timestamp that repeats keeps its first row: the ten crash-rate series repeat
  13 hours each with the same value and label, and ``api-01`` repeats 2017-11-05 01:00 (a
  daylight-saving fall-back) with another value; a streaming detector sees one point per time.
  A row with an empty (or non-finite) value is a missing point and is skipped, never a reason
  to refuse the series (``KpiSeries.missing`` counts them).
* **Events and windows**: each run of consecutive labelled rows is one event, and its window
  runs from the run's first row to its last (``run_windows``): a detection on a labelled row
  finds the event; one on any other row is a false alarm. No tolerance is added on either side:
  the labels mark the anomalous points themselves (NAB's windows, by contrast, were drawn
  around a point label and reward early detection). One exception: a one-row run followed by
  more rows gets the next row too, because NAB's scorer (like NAB's) scales the false alarms
  after a window by its width - 1 and rejects one-row windows (only ``machine-01`` has them).
  As in NAB, the first 15 % of each series (at most 750
  rows) is probation: not scored, so a labelled run inside it is not an event.
* **Quiet series**: series with no labelled row (``purchase-01``, ``ingress-03``,
  ``unavail-01``); every detection there is a false alarm (their notes say their spikes and
  isolated errors are normal).

``corpus_tables`` streams every series through each method (``nab_loco.raw_scores``) and
scores each file at every threshold (``nab_events.file_table``, NAB standard costs). The
cross-corpus protocol is ``aiops_harness.evals.detector_transfer``;
``python -m aiops_harness.evals.cloud_kpi
[datasets] [cache]`` prints its tables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from aiops_harness.datasets import datasets
from aiops_harness.evals.nab_events import FileTable, file_table
from aiops_harness.evals.nab_loco import THRESHOLDS, Candidate, raw_scores
from aiops_harness.evals.nab_score import CostMatrix, FloatArray, IntArray, Windows

__all__ = [
    "DATASETS",
    "KpiSeries",
    "corpus_tables",
    "labelled_runs",
    "load_corpus",
    "main",
    "read_kpi",
    "run_windows",
]

DATASETS = datasets()
# Bump when reading or windowing changes what the cached raw scores were computed on.
_CORPUS_TAG = "cloud_kpi1"


@dataclass(frozen=True)
class KpiSeries:
    """One labelled series, one row per distinct timestamp."""

    rel: str                                # "<family>/<series>.csv"
    times: npt.NDArray[np.datetime64]       # datetime64[ns], strictly increasing
    values: FloatArray
    labels: IntArray                        # 1: labelled anomalous
    windows: Windows                        # one per labelled run (see ``run_windows``)
    duplicates: int                         # rows dropped for a repeated timestamp
    note: str                               # the series' -metadata.json notes
    missing: int = 0                        # rows skipped for an empty or non-finite value

    @property
    def family(self) -> str:
        return self.rel.split("/")[0]

    @property
    def quiet(self) -> bool:
        """No labelled row: every detection is a false alarm."""
        return not self.windows


def labelled_runs(labels: npt.ArrayLike) -> list[tuple[int, int]]:
    """(first, last) row of each run of consecutive labelled rows."""
    flag = np.r_[0, np.asarray(labels) != 0, 0].astype(np.int8)
    edges = np.diff(flag)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def run_windows(times: npt.NDArray[np.datetime64], labels: npt.ArrayLike) -> Windows:
    """One window per labelled run, from its first row to its last; a one-row run with rows
    after it ends one row later (NAB's scorer needs two rows). That row is unlabelled, so the
    next run starts after it: windows never overlap."""
    n = len(times)
    ts = times.astype("datetime64[ns]")
    return [(ts[a], ts[b + 1 if a == b and b + 1 < n else b]) for a, b in labelled_runs(labels)]


def read_kpi(root: Path, rel: str) -> KpiSeries:
    """One series of ``root`` (the corpus's ``data/`` folder)."""
    path = root / rel
    opts = pacsv.ConvertOptions(column_types={"TimeStamp": pa.string(), "Value": pa.float64(),
                                              "Label": pa.int64()})
    table = pacsv.read_csv(path, convert_options=opts)
    stamps = pc.utf8_rtrim(table.column("TimeStamp"), characters="Z")
    times = pc.cast(stamps, pa.timestamp("ns")).to_numpy().astype("datetime64[ns]")
    values = pc.fill_null(table.column("Value"), float("nan")).to_numpy().astype(np.float64)
    labels = pc.fill_null(table.column("Label"), 0).to_numpy().astype(np.int64)
    if np.any(np.diff(times) < np.timedelta64(0, "ns")):
        raise ValueError(f"{rel}: timestamps out of order")
    # A row with no (or no finite) value is a missing point: skipped, as a streaming
    # detector never sees it; the series is kept.
    present = np.isfinite(values)
    times, values, labels = times[present], values[present], labels[present]
    keep = np.r_[True, np.diff(times) > np.timedelta64(0, "ns")]
    times, values, labels = times[keep], values[keep], labels[keep]
    meta = path.with_name(path.name + "-metadata.json")
    notes = json.loads(meta.read_text()).get("notes", []) if meta.exists() else []
    return KpiSeries(rel, times, values, labels, run_windows(times, labels),
                     int((~keep).sum()), " ".join(str(n).strip() for n in notes),
                     int((~present).sum()))


def load_corpus(root: Path) -> dict[str, KpiSeries]:
    """Every series under ``root`` (``.../cloud_kpi/data``), by "<family>/<series>.csv"."""
    rels = sorted(p.relative_to(root).as_posix() for p in root.glob("*/*.csv"))
    if not rels:
        raise FileNotFoundError(f"no <family>/<series>.csv under {root}")
    return {rel: read_kpi(root, rel) for rel in rels}


def corpus_tables(series: Mapping[str, KpiSeries], candidates: Sequence[Candidate],
                  cost: CostMatrix, cache_dir: Path | None = None,
                  progress: Callable[[str], None] | None = None
                  ) -> tuple[dict[str, dict[str, FileTable]], dict[str, float]]:
    """Per candidate key, per series, its ``file_table`` over ``THRESHOLDS`` (the same rule
    as ``nab_loco.tables_for``); and the seconds each method took (0: from the cache)."""
    rels = sorted(series)

    def load(rel: str) -> tuple[npt.NDArray[np.datetime64], FloatArray]:
        return series[rel].times, series[rel].values

    tables: dict[str, dict[str, FileTable]] = {}
    seconds: dict[str, float] = {}
    memo: dict[str, dict[str, FloatArray]] = {}
    for c in candidates:
        if c.spec.key not in seconds:
            started = time.perf_counter()
            raw_scores(Path(), c.spec, rels, cache_dir, memo, load, _CORPUS_TAG)
            seconds[c.spec.key] = time.perf_counter() - started
            if progress:
                progress(f"cloud_kpi {c.spec.key}: {seconds[c.spec.key]:.1f} s")
        scores = memo[c.spec.key]
        tables[c.key] = {r: file_table(r, series[r].times, scores[r], series[r].windows, cost,
                                       THRESHOLDS, c.quiet) for r in rels}
    return tables, seconds


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m aiops_harness.evals.cloud_kpi [datasets] [cache]``: the transfer tables."""
    import sys

    from aiops_harness.evals.detector_transfer import render, run_transfer

    args = list(sys.argv[1:] if argv is None else argv)
    datasets = Path(args[0]) if args else DATASETS
    cache = Path(args[1]) if len(args) > 1 else None
    print(render(run_transfer(datasets / "nab", datasets / "cloud_kpi" / "data",
                              cache_dir=cache, progress=print)))


if __name__ == "__main__":
    main()

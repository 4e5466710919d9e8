"""Log template mining on Loghub-2.0's 2k sets, scored as the Loghub-2.0 benchmark scores it.

Every system folder under the corpus root that holds ``<System>_2k.log_structured_corrected.csv``
is evaluated: its ``Content`` lines go into the project's ``logs`` table (a throwaway DuckDB
store), are read back in order with SQL, and are mined by :mod:`aiops.analytics.logs` with one
configuration for all systems. The ground truth (``EventTemplate``) is read only to score.

The metrics follow logpai/loghub-2.0 ``benchmark/evaluation`` (``logparser/utils/evaluator.py``
and ``utils/PA_calculator.py``):

* GA (grouping accuracy): a line counts when the set of lines sharing its predicted template is
  exactly the set sharing its true template. Like the benchmark, groups are formed by template
  string, so two clusters that end with the same template are one group.
* PA (parsing accuracy): a line counts when its predicted template string equals the corrected
  ground-truth template exactly (the benchmark compares the two columns as strings).

The published Drain rows (Loghub-2.0, ISSTA 2024) are read from
``published/loghub2_issta24_effectiveness_2k_vs_full.csv`` beside the corpus.

The miner's defaults were chosen on these systems, so these figures are in-sample;
:mod:`aiops_harness.evals.loghub_loso` scores each system with a setting chosen on the others.
"""

from __future__ import annotations

import csv
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
from rich.table import Table

from aiops.analytics.logs import LogTemplates, mine
from aiops.schema import LOGS
from aiops.store import Store

__all__ = [
    "PUBLISHED_FILE",
    "LoghubReport",
    "SliceScore",
    "SystemScore",
    "discover",
    "grouping_accuracy",
    "parsing_accuracy",
    "published_drain",
    "read_system",
    "render",
    "render_slices",
    "run_loghub",
    "run_slices",
]

SUFFIX = "_2k.log_structured_corrected.csv"
PUBLISHED_FILE = "loghub2_issta24_effectiveness_2k_vs_full.csv"
# Synthetic event times for the loaded lines: one millisecond apart, in file order.
_T0_NS = 1_700_000_000_000_000_000
_STEP_NS = 1_000_000


@dataclass(frozen=True)
class SystemScore:
    system: str
    lines: int
    true_templates: int
    found_templates: int
    ga: float
    pa: float
    drain_ga: float | None  # published Drain, 2k set; None when the paper has no figure
    drain_pa: float | None


@dataclass(frozen=True)
class LoghubReport:
    systems: list[SystemScore]
    seconds: float

    @property
    def mean_ga(self) -> float:
        return sum(s.ga for s in self.systems) / len(self.systems)

    @property
    def mean_pa(self) -> float:
        return sum(s.pa for s in self.systems) / len(self.systems)

    def system(self, name: str) -> SystemScore:
        return next(s for s in self.systems if s.system == name)


# -- metrics ---------------------------------------------------------------------------------


def grouping_accuracy(truth: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    """Fraction of lines whose predicted group holds exactly the lines of their true group."""
    if len(truth) != len(predicted):
        raise ValueError("truth and prediction differ in length")
    if not truth:
        return 0.0
    true_groups: dict[Hashable, list[int]] = defaultdict(list)
    sizes: dict[Hashable, int] = defaultdict(int)
    for i, (t, p) in enumerate(zip(truth, predicted, strict=True)):
        true_groups[t].append(i)
        sizes[p] += 1
    correct = 0
    for lines in true_groups.values():
        found = {predicted[i] for i in lines}
        if len(found) == 1 and sizes[found.pop()] == len(lines):
            correct += len(lines)
    return correct / len(truth)


def parsing_accuracy(truth: Sequence[str], predicted: Sequence[str]) -> float:
    """Fraction of lines whose predicted template equals the true one, string for string."""
    if len(truth) != len(predicted):
        raise ValueError("truth and prediction differ in length")
    if not truth:
        return 0.0
    return sum(t == p for t, p in zip(truth, predicted, strict=True)) / len(truth)


# -- the corpus ------------------------------------------------------------------------------


def discover(root: Path) -> dict[str, Path]:
    """Every system under ``root``: folder name -> its structured, corrected ground truth."""
    found = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        path = folder / f"{folder.name}{SUFFIX}"
        if path.is_file():
            found[folder.name] = path
    if not found:
        raise FileNotFoundError(f"no *{SUFFIX} under {root}")
    return found


def _read(path: Path) -> pa.Table:
    columns = {"LineId": pa.int64(), "Content": pa.string(), "EventTemplate": pa.string()}
    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types=columns, include_columns=list(columns), strings_can_be_null=False))


def read_system(path: Path) -> tuple[list[str], list[str]]:
    """One system's log lines (``Content``, in file order) and their true templates."""
    data = _read(path)
    return data.column("Content").to_pylist(), data.column("EventTemplate").to_pylist()


def _logs_batch(system: str, data: pa.Table) -> pa.Table:
    """The lines of one system as rows of the ``logs`` table."""
    n = data.num_rows
    times = [_T0_NS + int(i) * _STEP_NS for i in data.column("LineId").to_pylist()]
    given = {
        "time": pa.array(times, pa.timestamp("ns")),
        "body": data.column("Content"),
        "service_name": pa.array([system] * n, pa.string()),
    }
    schema = LOGS.arrow_schema
    return pa.table([given.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


def _bodies(store: Store, system: str) -> list[str]:
    rows = store.query("SELECT body FROM logs WHERE service_name = ? ORDER BY time",
                       [system]).rows
    return [str(r[0]) for r in rows]


def published_drain(path: Path) -> dict[str, tuple[float | None, float | None]]:
    """System -> (GA, PA) of Drain on the 2k set, from the paper's effectiveness table (cells
    read ``2k / full``; ``------`` where there is no figure)."""
    found: dict[str, dict[str, float | None]] = defaultdict(dict)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            system, _, metric = row["dataset+metrics"].rpartition(" ")
            cell = row["Drain"].split("/")[0].strip()
            found[system][metric] = None if cell.startswith("-") else float(cell)
    return {s: (m.get("GA"), m.get("PA")) for s, m in found.items()}


def run_loghub(root: Path, published: Path | None = None, db: Path | None = None
               ) -> LoghubReport:
    """Mine and score every system under ``root``; the published Drain figures come from
    ``published`` (default: ``<root>/../published/`` + :data:`PUBLISHED_FILE`). The lines go
    through a store at ``db`` (a new file), or a temporary one."""
    published = published or root.parent / "published" / PUBLISHED_FILE
    drain = published_drain(published) if published.is_file() else {}
    systems = discover(root)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loghub-") as tmp:
        store = Store(db or Path(tmp) / "loghub.duckdb")
        try:
            truths = {}
            for system, path in systems.items():
                data = _read(path)
                store.append("logs", _logs_batch(system, data))
                truths[system] = data.column("EventTemplate").to_pylist()
            scores = [_score(system, truth, _bodies(store, system), drain)
                      for system, truth in truths.items()]
        finally:
            store.close()
    return LoghubReport(scores, time.perf_counter() - started)


def _score(system: str, truth: list[str], bodies: list[str],
           drain: dict[str, tuple[float | None, float | None]]) -> SystemScore:
    predicted = mine(bodies, LogTemplates())
    return SystemScore(system, len(truth), len(set(truth)), len(set(predicted)),
                       grouping_accuracy(truth, predicted), parsing_accuracy(truth, predicted),
                       *drain.get(system, (None, None)))


@dataclass(frozen=True)
class SliceScore:
    """One system mined in consecutive slices of ``size`` lines (each slice a fresh miner),
    the scores averaged over the slices: fewer lines per template, as on a system with many
    rare templates."""

    system: str
    size: int
    slices: int
    ga: float
    pa: float
    ratio: float  # found / true templates, averaged over the slices


def run_slices(root: Path, sizes: Sequence[int], miner: Callable[[], LogTemplates] = LogTemplates
               ) -> list[SliceScore]:
    """Every system at every slice size. Slices are disjoint and start every
    ``max(size, 400)`` lines, so at most five slices a system are mined per size."""
    out = []
    for system, path in discover(root).items():
        bodies, truth = read_system(path)
        for size in sizes:
            scores = []
            for start in range(0, len(bodies) - size + 1, max(size, 400)):
                b, t = bodies[start:start + size], truth[start:start + size]
                predicted = mine(b, miner())
                scores.append((grouping_accuracy(t, predicted), parsing_accuracy(t, predicted),
                               len(set(predicted)) / len(set(t))))
            if scores:
                n = len(scores)
                out.append(SliceScore(system, size, n, sum(x[0] for x in scores) / n,
                                      sum(x[1] for x in scores) / n,
                                      sum(x[2] for x in scores) / n))
    return out


def render_slices(scores: Sequence[SliceScore]) -> Table:
    """GA and found/true templates per system and slice size."""
    sizes = sorted({s.size for s in scores})
    table = Table("system", *(f"{n} lines: GA / found:true" for n in sizes),
                  title="Loghub-2.0 2k in slices (each slice mined alone)")
    by = {(s.system, s.size): s for s in scores}
    for system in sorted({s.system for s in scores}):
        table.add_row(system, *(f"{by[system, n].ga:.3f} / {by[system, n].ratio:.2f}"
                                if (system, n) in by else "-" for n in sizes))
    return table


def render(report: LoghubReport) -> Table:
    """Per-system GA/PA beside Drain's published 2k figures, and the means."""
    table = Table("system", "lines", "templates (found/true)", "GA", "PA",
                  "Drain GA (published)", "Drain PA (published)",
                  title=f"Loghub-2.0 2k: template mining ({report.seconds:.1f} s)")
    for s in report.systems:
        table.add_row(s.system, f"{s.lines:,}", f"{s.found_templates}/{s.true_templates}",
                      f"{s.ga:.3f}", f"{s.pa:.3f}", _cell(s.drain_ga), _cell(s.drain_pa))
    drain_ga = [s.drain_ga for s in report.systems if s.drain_ga is not None]
    drain_pa = [s.drain_pa for s in report.systems if s.drain_pa is not None]
    table.add_section()
    table.add_row("mean", f"{sum(s.lines for s in report.systems):,}", "",
                  f"{report.mean_ga:.3f}", f"{report.mean_pa:.3f}",
                  _cell(_mean(drain_ga, len(report.systems))),
                  _cell(_mean(drain_pa, len(report.systems))))
    return table


def _mean(values: list[float], expected: int) -> float | None:
    """The mean over every system, or None when a published figure is missing."""
    return sum(values) / len(values) if values and len(values) == expected else None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"

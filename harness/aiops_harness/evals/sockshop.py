"""Root-cause ranking on the RCD Sock Shop corpus (azamikram/rcd), scored as in RCAEval.

Every ``<service>-<cpu|mem>/<rep>/`` case holds ``normal.csv`` and ``anomalous.csv``: one row
per second, one column per ``<service>_<metric>`` (container CPU and memory, latency
percentiles and load of three services). Both files go into the project's ``metric_points``
table (metric name + service), the fault-free file is the baseline window and the anomalous
one the anomaly window, and :func:`aiops.analytics.rca.rank` -- the same ranker, with the same
parameters, as for every other corpus -- orders the services. Score: AC@k, the share of cases
whose true service is in the top k, and Avg@5, the mean of AC@1..AC@5, per fault type.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from aiops.analytics.rca import RankConfig, RootCause, Symptom, Window, rank
from aiops.analytics.topology import ServiceMap
from aiops.schema import METRIC_POINTS
from aiops.store import Store
from aiops_harness.datasets import DATASETS

__all__ = ["SERVICE_MAP", "Case", "CaseResult", "SockShopReport", "load_case", "render",
           "run_sockshop"]

FAULT_TYPES = ("cpu", "mem")
# Published columns (published/rcaeval_ase24_table5_avg5.csv) for this corpus.
_PUBLISHED_COLUMNS = {"cpu": "SS1_CPU", "mem": "SS1_MEM"}


@dataclass(frozen=True)
class Case:
    service: str
    fault: str
    rep: str
    folder: Path

    @property
    def name(self) -> str:
        return f"{self.service}-{self.fault}/{self.rep}"


@dataclass(frozen=True)
class CaseResult:
    case: Case
    rank: int | None  # 1-based position of the true service; None when absent
    top: list[RootCause]


@dataclass
class SockShopReport:
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def ac(self, k: int, fault: str | None = None) -> float:
        rs = [r for r in self.results if fault is None or r.case.fault == fault]
        hits = sum(1 for r in rs if r.rank is not None and r.rank <= k)
        return hits / len(rs) if rs else 0.0

    def avg5(self, fault: str | None = None) -> float:
        return sum(self.ac(k, fault) for k in range(1, 6)) / 5


def cases(root: Path) -> list[Case]:
    out = []
    for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
        service, _, fault = folder.parent.name.rpartition("-")
        if fault in FAULT_TYPES and (folder / "anomalous.csv").is_file():
            out.append(Case(service, fault, folder.name, folder))
    return out


def _points(path: Path) -> tuple[pa.Table, Window]:
    """One CSV (``time`` in epoch seconds, then ``<service>_<metric>`` columns) as
    metric_points rows, and the window it covers."""
    table = pacsv.read_csv(path)
    seconds = table.column("time").cast(pa.int64()).to_pylist()
    times = pa.array([s * 1_000_000_000 for s in seconds], pa.timestamp("ns"))
    parts = []
    for column in table.column_names:
        if column == "time":
            continue
        service, _, metric = column.partition("_")
        n = table.num_rows
        parts.append(pa.table({
            "time": times,
            "name": pa.array([metric] * n),
            "type": pa.array(["gauge"] * n),
            "value": table.column(column).cast(pa.float64()),
            "service_name": pa.array([service] * n),
            "resource_attributes": pa.array([f'{{"service.name":"{service}"}}'] * n),
        }))
    start = datetime.fromtimestamp(min(seconds), UTC)
    end = datetime.fromtimestamp(max(seconds), UTC) + timedelta(seconds=1)
    return pa.concat_tables(parts), Window(start, end)


def load_case(store: Store, case: Case) -> tuple[Window, Window]:
    """Load a case into ``store``; return (baseline, anomaly) windows."""
    normal, baseline = _points(case.folder / "normal.csv")
    anomalous, anomaly = _points(case.folder / "anomalous.csv")
    store.append(METRIC_POINTS.name, pa.concat_tables([normal, anomalous]))
    return baseline, anomaly


SERVICE_MAP = Path(__file__).with_name("topologies") / "sockshop.yaml"


# The service Sock Shop's users call (its documented architecture): every case's symptom when
# the ranking is symptom-led; the corpus names no alarm, so the kind is left open.
ENTRY = Symptom("front-end")


def run_sockshop(root: Path, config: RankConfig | None = None,
                 topology: ServiceMap | None = None,
                 symptom: Symptom | None = None) -> SockShopReport:
    """Rank every case under ``root/sock-shop-data``; ``topology``: a declared service map
    (the corpus has metrics only, so no call edges from traces); ``symptom`` (``ENTRY``):
    symptom-led."""
    started = time.monotonic()
    report = SockShopReport()
    for case in cases(root / "sock-shop-data"):
        store = Store(None)
        try:
            baseline, anomaly = load_case(store, case)
            ranked = rank(store, anomaly, baseline, entity="service.name", config=config,
                          topology=topology, symptom=symptom)
        finally:
            store.close()
        names = [r.entity for r in ranked]
        pos = names.index(case.service) + 1 if case.service in names else None
        report.results.append(CaseResult(case, pos, ranked[:5]))
    report.seconds = time.monotonic() - started
    return report


def published_rows(path: Path) -> list[tuple[str, dict[str, float]]]:
    """(method, {"SS1_CPU": .., "SS1_MEM": ..}) rows of RCAEval's Table 5."""
    rows = []
    with path.open() as fh:
        for rec in csv.DictReader(fh):
            vals = {}
            for col in _PUBLISHED_COLUMNS.values():
                try:
                    vals[col] = float(rec[col])
                except (KeyError, ValueError):
                    continue
            if vals:
                rows.append((rec["method"], vals))
    return rows


def render(report: SockShopReport, published: Path | None = None) -> str:
    """A Markdown table of Avg@5 per fault type beside the published rows."""
    lines = ["| method | cases | Avg@5 CPU | Avg@5 MEM | Avg@5 all |", "|---|---|---|---|---|"]
    lines.append(f"| aiops rca (this run) | {len(report.results)} | {report.avg5('cpu'):.2f} | "
                 f"{report.avg5('mem'):.2f} | {report.avg5():.2f} |")
    pub = published_rows(published) if published is not None and published.is_file() else []
    for method, vals in pub:
        cpu, mem = vals.get("SS1_CPU"), vals.get("SS1_MEM")
        both = f"{(cpu + mem) / 2:.2f}" if cpu is not None and mem is not None else ""
        lines.append(f"| {method} (published) | | {_fmt(cpu)} | {_fmt(mem)} | {both} |")
    ranks = ", ".join(f"{r.case.name}={r.rank}" for r in report.results if r.rank != 1)
    lines += ["", f"{len(report.results)} cases in {report.seconds:.1f} s; not first: "
              f"{ranks or 'none'}."]
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> None:
    """``python -m aiops_harness.evals.sockshop [DATASETS]``: run and print the table."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    datasets = Path(args[0]) if args else DATASETS
    report = run_sockshop(datasets / "rcd_sockshop")
    print(render(report, datasets / "published" / "rcaeval_ase24_table5_avg5.csv"))


if __name__ == "__main__":
    main()

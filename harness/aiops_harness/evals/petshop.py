"""Root-cause ranking on the PetShop RCA dataset (amazon-science/petshop-root-cause-analysis).

A cloud application of 41 nodes (containers, Lambdas, DynamoDB, queues ...) seen only through
per-node latency, availability and request statistics at 5-minute steps (CloudWatch/X-Ray),
with a declared call graph (``graph.csv``: row calls column) and no traces. Every issue folder
holds the metrics around one injected fault and ``target.json``: the node and metric that
alarmed (the **symptom**) and the node where the fault was injected (the truth). The scenario's
``noissue/metrics.csv`` is the baseline window, the issue's metrics the anomaly window; both go
into the project's ``metric_points`` table (``<metric>_<statistic>`` + node) and
:func:`aiops.analytics.rca.rank` -- the same ranker and parameters as for every other corpus --
orders the nodes, given the graph as a declared service map and, where asked, the symptom.
Score: recall@k per issue metric (latency, availability), as the published traversal baseline
(``published/petshop_notebook_traversal_baseline.csv``) reports it, over train + test issues.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from aiops.analytics.rca import FaultClass, RankConfig, RootCause, Symptom, Window, rank
from aiops.analytics.topology import ServiceMap
from aiops.schema import METRIC_POINTS
from aiops.store import Store
from aiops_harness.datasets import DATASETS

__all__ = ["Issue", "IssueResult", "PetShopReport", "load_graph", "load_issue", "render",
           "run_petshop"]

STEP_S = 300  # the corpus' 5-minute points
# The anomaly window: the alarm's step and the two after it. Chosen from where the alarm falls
# in the issues' files (every low-traffic issue's timestamps, not its root cause): each file
# holds 5 steps, the alarm in the second and the fault's points mostly in the third and fourth;
# the whole file as the window (the fault in 2 of 5 points) hid most faults from a level that
# must hold for half the window (RankConfig.anomaly_q).
ANOMALY_STEPS = 3


@dataclass(frozen=True)
class Issue:
    scenario: str
    split: str  # train or test
    name: str
    folder: Path
    symptom: str  # target.node: the node that alarmed
    metric: str  # target.metric: latency or availability
    alarm_s: int  # target.timestamp: when it alarmed
    root_cause: str

    @property
    def id(self) -> str:
        return f"{self.scenario}/{self.split}/{self.name}"


@dataclass(frozen=True)
class IssueResult:
    issue: Issue
    rank: int | None  # 1-based place of the true node; None when not ranked
    top: list[RootCause]


@dataclass
class PetShopReport:
    results: list[IssueResult] = field(default_factory=list)
    seconds: float = 0.0
    symptom_led: bool = True
    peers: bool = True

    @property
    def label(self) -> str:
        return (("symptom-led" if self.symptom_led else "no symptom")
                + (", peers" if self.peers else ""))

    def recall(self, k: int, metric: str | None = None) -> float:
        rs = [r for r in self.results if metric is None or r.issue.metric == metric]
        hits = sum(1 for r in rs if r.rank is not None and r.rank <= k)
        return hits / len(rs) if rs else 0.0

    def count(self, metric: str | None = None) -> int:
        return sum(1 for r in self.results if metric is None or r.issue.metric == metric)


def issues(scenario_dir: Path) -> list[Issue]:
    out = []
    for split in ("train", "test"):
        for folder in sorted((scenario_dir / split).glob("issue_*"),
                             key=lambda p: int(p.name.partition("_")[2])):
            target = json.loads((folder / "target.json").read_text())
            out.append(Issue(scenario_dir.name, split, folder.name, folder,
                             target["target"]["node"], target["target"]["metric"],
                             int(target["target"]["timestamp"]), target["root_cause"]["node"]))
    return out


def load_graph(path: Path) -> ServiceMap:
    """``graph.csv``: an adjacency matrix, row calls column."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    callees = rows[0][1:]
    edges = {(row[0], callee) for row in rows[1:]
             for callee, cell in zip(callees, row[1:], strict=False)
             if cell.strip() not in ("", "0", "0.0") and row[0] != callee}
    return ServiceMap(frozenset(edges))


def _points(path: Path) -> tuple[pa.Table, Window]:
    """One metrics.csv (header rows microservice / metric / statistic / unix_timestamp, then
    one row per 5-minute step) as metric_points rows, and the window it covers."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    nodes, metrics, stats = rows[0][1:], rows[1][1:], rows[2][1:]
    data = [r for r in rows[4:] if r and r[0]]
    seconds = [int(float(r[0])) for r in data]
    times, names, values, services = [], [], [], []
    for j, (node, metric, stat) in enumerate(zip(nodes, metrics, stats, strict=True)):
        for t, r in zip(seconds, data, strict=True):
            cell = r[j + 1] if j + 1 < len(r) else ""
            if cell.strip() == "":
                continue
            times.append(t * 1_000_000_000)
            names.append(f"{metric}_{stat}")
            values.append(float(cell))
            services.append(node)
    n = len(times)
    table = pa.table({
        "time": pa.array(times, pa.timestamp("ns")),
        "name": pa.array(names),
        "type": pa.array(["gauge"] * n),
        "value": pa.array(values, pa.float64()),
        "service_name": pa.array(services),
        "resource_attributes": pa.array([json.dumps({"service.name": s}) for s in services]),
    })
    start = datetime.fromtimestamp(min(seconds), UTC)
    end = datetime.fromtimestamp(max(seconds), UTC) + timedelta(seconds=STEP_S)
    return table, Window(start, end)


def load_issue(store: Store, issue: Issue) -> Window:
    """Load one issue into ``store``; return its anomaly window: from the step the alarm fell
    in, for ANOMALY_STEPS steps (the issue's file also holds the minutes before the fault)."""
    anomalous, _ = _points(issue.folder / "metrics.csv")
    store.append(METRIC_POINTS.name, anomalous)
    times = sorted({t // 1_000_000_000 for t in
                    anomalous.column("time").cast(pa.int64()).to_pylist()})
    first = max((t for t in times if t <= issue.alarm_s), default=times[0])
    start = datetime.fromtimestamp(first, UTC)
    return Window(start, start + timedelta(seconds=ANOMALY_STEPS * STEP_S))


def _symptom(issue: Issue) -> Symptom:
    """The alarmed node and what alarmed: latency, or availability (a share that failed)."""
    kind = FaultClass.LATENCY if issue.metric == "latency" else FaultClass.ERRORS
    return Symptom(issue.symptom, kind)


def run_petshop(scenario_dir: Path, config: RankConfig | None = None,
                symptom_led: bool = True, peers: bool = True) -> PetShopReport:
    """Rank every issue of one traffic scenario (``.../dataset/low_traffic``). The scenario's
    files cover disjoint times, so they share one store. ``peers``: each issue is ranked with
    the scenario's *other* issues' anomaly windows as its peers (``rank(peers=...)``; their
    metrics only, never their root causes): leave-one-issue-out."""
    started = time.monotonic()
    graph = load_graph(scenario_dir / "graph.csv")
    report = PetShopReport(symptom_led=symptom_led, peers=peers)
    all_issues = issues(scenario_dir)
    store = Store(None)
    try:
        base_points, base = _points(scenario_dir / "noissue" / "metrics.csv")
        store.append(METRIC_POINTS.name, base_points)
        windows = {issue.id: load_issue(store, issue) for issue in all_issues}
        for issue in all_issues:
            others = [w for i, w in windows.items() if i != issue.id] if peers else []
            ranked = rank(store, windows[issue.id], base, entity="service.name",
                          config=config, topology=graph,
                          symptom=_symptom(issue) if symptom_led else None, peers=others)
            names = [r.entity for r in ranked]
            pos = names.index(issue.root_cause) + 1 if issue.root_cause in names else None
            report.results.append(IssueResult(issue, pos, ranked[:5]))
    finally:
        store.close()
    report.seconds = time.monotonic() - started
    return report


def published(path: Path, scenario: str) -> dict[str, tuple[float, float]]:
    """{issue metric: (recall@1, recall@3)} of the published traversal baseline."""
    out = {}
    with path.open() as fh:
        for rec in csv.DictReader(line for line in fh if not line.startswith("#")):
            if rec["scenario"] == scenario:
                out[rec["issue_metric"]] = (float(rec["recall_top1"]), float(rec["recall_top3"]))
    return out


def render(reports: list[PetShopReport], baseline: dict[str, tuple[float, float]]) -> str:
    """recall@1 / @3 per issue metric, each report and the published traversal."""
    lines = ["| method | issue metric | issues | recall@1 | recall@3 |", "|---|---|---|---|---|"]
    for report in reports:
        label = f"aiops rca, {report.label}"
        for metric in ("latency", "availability"):
            lines.append(f"| {label} | {metric} | {report.count(metric)} | "
                         f"{report.recall(1, metric):.3f} | {report.recall(3, metric):.3f} |")
    for metric, (r1, r3) in sorted(baseline.items(), reverse=True):
        lines.append(f"| anomaly traversal (published) | {metric} | | {r1:.3f} | {r3:.3f} |")
    for report in reports:
        missed = ", ".join(f"{r.issue.split}/{r.issue.name}={r.rank}" for r in report.results
                           if r.rank != 1)
        lines += ["", f"{report.label}: "
                  f"{len(report.results)} issues in {report.seconds:.1f} s; not first: "
                  f"{missed or 'none'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m aiops_harness.evals.petshop [DATASETS] [SCENARIO]``: run and print the table."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    datasets = Path(args[0]) if args else DATASETS
    scenario = args[1] if len(args) > 1 else "low_traffic"
    folder = datasets / "petshop" / "dataset" / scenario
    reports = [run_petshop(folder, symptom_led=led, peers=peers)
               for peers in (False, True) for led in (False, True)]
    print(render(reports, published(
        datasets / "published" / "petshop_notebook_traversal_baseline.csv", scenario)))


if __name__ == "__main__":
    main()

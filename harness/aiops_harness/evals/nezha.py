"""Root-cause ranking on the Nezha corpus (IntelligentDDS/Nezha, ESEC/FSE 2023).

Every day folder under ``rca_data/`` (TrainTicket 2023-01-29, Online Boutique 2022-08-22 here)
is converted once into the project's own ``spans``/``logs``/``metric_points`` tables -- the
same rows an OTLP collector would write -- and each fault of its ``<date>-fault_list.json`` is
then ranked by :func:`aiops.analytics.rca.rank` over that store, exactly as a live incident
would be. Scoring is service level: AS@k, the share of faults whose injected service (the pod
name without its last two dash groups) is among the top k.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from aiops.analytics.rca import RankConfig, RootCause, Symptom, Window, rank
from aiops.analytics.topology import ServiceMap
from aiops.schema import LOGS, METRIC_POINTS, SPANS
from aiops.store import Store
from aiops_harness.datasets import DATASETS

__all__ = [
    "Fault",
    "FaultResult",
    "NezhaReport",
    "SystemReport",
    "load_day",
    "render",
    "run_nezha",
    "service_of",
]

# Published rows use these column prefixes (published/nezha_fse23_table3_table4.csv).
_PUBLISHED_PREFIX = {"TrainTicket": "TT", "Online Boutique": "OB"}

# Windows around an injection, the same for every fault of every system: the fault's first
# minutes ...
ANOMALY = timedelta(minutes=3)
# ... against the hour before it plus the corpus's fault-free period (construct_data), less
# the minutes after every injection of the day: faults outlast their scoring window (and
# the same service is often faulted again minutes later).
BASELINE = timedelta(minutes=60)
AFTERMATH = timedelta(minutes=5)

# What rca's fault class should say for each injected fault type.
EXPECTED_CLASS = {"cpu_contention": "cpu", "cpu_consumed": "cpu", "network_delay": "network",
                  "return": "errors", "exception": "errors"}


def service_of(pod: str) -> str:
    """Kubernetes pod name -> its deployment (service): drop the last two dash groups."""
    return pod.rsplit("-", 2)[0]


@dataclass(frozen=True)
class Fault:
    system: str
    inject_time: datetime
    pod: str
    kind: str

    @property
    def service(self) -> str:
        return service_of(self.pod)


@dataclass(frozen=True)
class FaultResult:
    fault: Fault
    rank: int | None  # 1-based position of the true service; None when absent
    top: list[RootCause]


@dataclass
class SystemReport:
    system: str
    results: list[FaultResult] = field(default_factory=list)

    def at(self, k: int) -> float:
        """AS@k: the share of faults whose service is among the top k."""
        hits = sum(1 for r in self.results if r.rank is not None and r.rank <= k)
        return hits / len(self.results) if self.results else 0.0

    def class_accuracy(self) -> float:
        """Of the faults ranked first, the share whose fault class matches the injection."""
        firsts = [r for r in self.results if r.rank == 1 and r.top]
        right = sum(1 for r in firsts
                    if EXPECTED_CLASS.get(r.fault.kind) == str(r.top[0].fault_class))
        return right / len(firsts) if firsts else 0.0


@dataclass
class NezhaReport:
    systems: dict[str, SystemReport]
    seconds: float


# -- conversion into the project's tables -----------------------------------------------------

def _csvs(folder: Path, pattern: str) -> list[str]:
    return sorted(str(p) for p in folder.glob(pattern))


def _read_csvs(files: list[str], types: dict[str, pa.DataType],
               drop: Sequence[str] | None = None) -> pa.Table:
    """Concatenate gzipped CSVs with pyarrow: it takes the multi-kilobyte quoted log lines in
    its stride, and a row the exporter garbled (two records run together) is skipped. Only
    the ``types`` columns are read, unless ``drop`` names the ones to leave out instead."""
    parse = pacsv.ParseOptions(invalid_row_handler=lambda _row: "skip")
    convert = pacsv.ConvertOptions(column_types=types,
                                   include_columns=list(types) if drop is None else None)
    tables = []
    for f in files:
        t = pacsv.read_csv(f, parse_options=parse, convert_options=convert)
        tables.append(t.drop_columns([c for c in drop or () if c in t.column_names]))
    return pa.concat_tables(tables, promote_options="permissive")


def _resource_sql(pod: str) -> str:
    """Resource attributes of a pod's telemetry, as the OTel k8s processor would set them."""
    svc = f"regexp_replace({pod}, '-[^-]+-[^-]+$', '')"
    return (f"{svc} AS service_name, json_object('service.name', {svc}, "
            f"'service.instance.id', {pod}, 'k8s.pod.name', {pod}) AS resource_attributes")


def _spans(con: duckdb.DuckDBPyConnection, files: list[str]) -> pa.Table:
    # Minute files overlap (a trace is cut into the file of each minute it touches): keep
    # every span once. Nezha's traces carry no status; Duration is in microseconds.
    sql = f"""
        SELECT DISTINCT ON (TraceID, SpanID)
            TraceID AS trace_id, SpanID AS span_id, NULLIF(ParentID, 'root') AS parent_span_id,
            OperationName AS name,
            make_timestamp_ns(StartTimeUnixNano) AS start_time,
            make_timestamp_ns(EndTimeUnixNano) AS end_time,
            EndTimeUnixNano - StartTimeUnixNano AS duration_ns,
            {_resource_sql('PodName')}
        FROM raw
        ORDER BY start_time"""
    con.register("raw", _read_csvs(files, {
        "StartTimeUnixNano": pa.int64(), "EndTimeUnixNano": pa.int64(), "TraceID": pa.string(),
        "SpanID": pa.string(), "ParentID": pa.string(), "PodName": pa.string(),
        "OperationName": pa.string()}))
    return con.sql(sql).to_arrow_table()


def _logs(con: duckdb.DuckDBPyConnection, files: list[str]) -> pa.Table:
    # The Log column is the container runtime's JSON line; its "log" field is what the
    # program wrote: a JSON record (Online Boutique: severity + message) or a plain Java
    # line "HH:MM:SS.mmm LEVEL logger#line message" (TrainTicket).
    sql = f"""
        WITH raw AS (
            -- TimeUnixNano is garbage on a few rows; the Timestamp text never is.
            SELECT *, json_extract_string(Log, '$.log') AS line,
                CAST(rtrim(Timestamp, 'Z') AS TIMESTAMP_NS) AS time
            FROM raw_logs WHERE json_valid(Log)
        ), parsed AS (
            SELECT *, CASE WHEN json_valid(line) AND starts_with(ltrim(line), '{{')
                THEN json_extract_string(line, '$.severity')
                ELSE regexp_extract(line, '^\\S+\\s+(TRACE|DEBUG|INFO|WARN|ERROR|FATAL)\\b', 1)
                END AS level,
                CASE WHEN json_valid(line) AND starts_with(ltrim(line), '{{')
                THEN json_extract_string(line, '$.message')
                ELSE regexp_replace(rtrim(line, chr(10)),
                                    '^\\S+\\s+(TRACE|DEBUG|INFO|WARN|ERROR|FATAL)\\s+', '')
                END AS message
            FROM raw
        )
        SELECT DISTINCT ON (time, PodName, message)
            time, time AS observed_time, NULLIF(TraceID, '') AS trace_id,
            NULLIF(SpanID, '') AS span_id,
            CASE upper(level) WHEN 'TRACE' THEN 1 WHEN 'DEBUG' THEN 5 WHEN 'INFO' THEN 9
                WHEN 'WARN' THEN 13 WHEN 'WARNING' THEN 13 WHEN 'ERROR' THEN 17
                WHEN 'FATAL' THEN 21 END::INTEGER AS severity_number,
            NULLIF(upper(level), '') AS severity_text, message AS body,
            {_resource_sql('PodName')},
            json_object('k8s.node.ip', Node, 'k8s.container.name', Container) AS attributes
        FROM parsed WHERE message IS NOT NULL
        ORDER BY time"""
    con.register("raw_logs", _read_csvs(files, {
        "Timestamp": pa.string(), "TraceID": pa.string(), "SpanID": pa.string(),
        "Log": pa.string(), "Node": pa.string(), "PodName": pa.string(),
        "Container": pa.string()}))
    return con.sql(sql).to_arrow_table()


# Per-pod metric columns: everything but the clock, the pod and the node's own gauges (they
# describe the machine the pod shares, not the pod).
_NOT_METRICS = ("Time", "TimeStamp", "PodName")


def _metrics(con: duckdb.DuckDBPyConnection, files: list[str]) -> pa.Table:
    m = _read_csvs(files, {"Time": pa.string(), "PodName": pa.string()}, drop=["TimeStamp"])
    con.register("m", m)
    cols = [c for c in m.column_names if c not in _NOT_METRICS and not c.startswith("Node")]
    unpivot = ", ".join(f'"{c}"' for c in cols)
    sql = f"""
        SELECT DISTINCT ON (PodName, name, time)
            time, name,
            'gauge' AS type, value::DOUBLE AS value, {_resource_sql('PodName')}
        -- TimeStamp is off by years in some files; the Time text ("2022-08-22 03:51:19.60..
        -- +0000 UTC m=+0.11") is right everywhere.
        FROM (UNPIVOT (SELECT CAST(left(Time, 19) AS TIMESTAMP_NS) AS time, PodName, {unpivot}
                       FROM m)
              ON {unpivot} INTO NAME name VALUE value)
        WHERE value IS NOT NULL AND NOT isnan(value::DOUBLE)
        ORDER BY time"""
    return con.sql(sql).to_arrow_table()


# Per-edge median latency (seconds) as the caller (source_50) and the callee (destination_50)
# measured it: one column per "caller_callee" (Kubernetes names have no "_"), one row a minute.
_EDGE_FILES = (("source_50.csv.gz", "source"), ("destination_50.csv.gz", "destination"))
EDGE_METRIC = "request_duration_p50"


def _edges(con: duckdb.DuckDBPyConnection, files: list[str]) -> pa.Table:
    """The edge files as mesh gauges with Istio's labels (reporter, source_workload,
    destination_workload) and no service of their own: what rca's mesh evidence reads."""
    parts = []
    for f in files:
        reporter = next(r for name, r in _EDGE_FILES if f.endswith(name))
        t = _read_csvs([f], {"time": pa.string()}, drop=["timestamp"])
        con.register(f"edges_{reporter}", t)
        cols = ", ".join(f'"{c}"' for c in t.column_names if c != "time")
        parts.append(f"""
            SELECT time, '{reporter}' AS reporter, edge, value
            FROM (UNPIVOT (SELECT CAST(left(time, 19) AS TIMESTAMP_NS) AS time, {cols}
                           FROM edges_{reporter})
                  ON {cols} INTO NAME edge VALUE value)""")
    return con.sql(f"""
        SELECT time, '{EDGE_METRIC}' AS name, 's' AS unit, 'gauge' AS type,
               value::DOUBLE AS value,
               json_object('reporter', reporter,
                           'source_workload', split_part(edge, '_', 1),
                           'destination_workload', split_part(edge, '_', 2)) AS attributes
        FROM ({' UNION ALL '.join(parts)})
        WHERE value IS NOT NULL AND NOT isnan(value::DOUBLE)
        ORDER BY time""").to_arrow_table()


ALL_SIGNALS = frozenset({"traces", "logs", "metrics", "mesh"})


def load_day(store: Store, rca_day: Path, construct_day: Path | None,
             signals: frozenset[str] = ALL_SIGNALS) -> dict[str, int]:
    """Convert one day of the corpus (and its fault-free construct period) into ``store``;
    ``signals`` picks what is loaded (``{"metrics"}``: a metrics-only stack)."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    try:
        folders = [rca_day] + ([construct_day] if construct_day and construct_day.is_dir()
                               else [])
        counts = {}
        for signal, table, sub, pattern, convert in (
            ("traces", SPANS, "trace", "*_trace.csv.gz", _spans),
            ("logs", LOGS, "log", "*_log.csv.gz", _logs),
            # construct_data metrics are the same files as rca_data's: read them once.
            ("metrics", METRIC_POINTS, "metric", "*_metric.csv.gz", _metrics),
        ):
            if signal not in signals:
                continue
            dirs = folders[:1] if table is METRIC_POINTS else folders
            files = [f for d in dirs for f in _csvs(d / sub, pattern)]
            if not files:
                counts[table.name] = 0
                continue
            batch = convert(con, files)
            counts[table.name] = store.append(table.name, batch)
        edge_files = [str(rca_day / "metric" / name) for name, _ in _EDGE_FILES
                      if (rca_day / "metric" / name).is_file()]
        if edge_files and "mesh" in signals:
            counts["mesh_edges"] = store.append(METRIC_POINTS.name, _edges(con, edge_files))
        return counts
    finally:
        con.close()


def construct_window(construct_day: Path | None) -> list[Window]:
    """The fault-free period of a day: the span of its construct_data traces, if any."""
    if construct_day is None:
        return []
    files = _csvs(construct_day / "trace", "*_trace.csv.gz")
    if not files:
        return []
    t = _read_csvs(files, {"StartTimeUnixNano": pa.int64(), "EndTimeUnixNano": pa.int64()})
    lo, hi = pc.min(t["StartTimeUnixNano"]).as_py(), pc.max(t["EndTimeUnixNano"]).as_py()
    if lo is None or hi is None:
        return []
    return [Window(_from_ns(int(lo)), _from_ns(int(hi)))]


def _from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


# -- faults and evaluation --------------------------------------------------------------------

def faults(rca_day: Path) -> list[Fault]:
    """The faults of one day folder, in injection order."""
    path = rca_day / f"{rca_day.name}-fault_list.json"
    data = json.loads(path.read_text())
    out = []
    for entries in data.values():
        for e in entries:
            # inject_time is UTC and matches the data; inject_timestamp is wrong for some
            # TrainTicket entries.
            t = datetime.strptime(e["inject_time"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            pod = e["inject_pod"]
            out.append(Fault(system_of(pod), t, pod, e["inject_type"]))
    return sorted(out, key=lambda f: f.inject_time)


def system_of(pod: str) -> str:
    """TrainTicket's services are all named ts-*; the rest of the corpus is Online Boutique."""
    return "TrainTicket" if pod.startswith("ts-") else "Online Boutique"


def windows_for(fault: Fault, day: Sequence[Fault], normal: Sequence[Window]
                ) -> tuple[Window, list[Window]]:
    """The fault's anomaly window and its baseline: the hour before plus the fault-free
    period, less the minutes after every injection of the day (its own included)."""
    t = fault.inject_time
    anomaly = Window(t, t + ANOMALY)
    busy = [(f.inject_time, f.inject_time + AFTERMATH) for f in day]
    baseline = []
    for w in [Window(t - BASELINE, t), *normal]:
        baseline += _subtract(w, busy)
    return anomaly, baseline


def _subtract(w: Window, holes: Sequence[tuple[datetime, datetime]]) -> list[Window]:
    pieces = [(w.start, w.end)]
    for lo, hi in sorted(holes):
        nxt = []
        for a, b in pieces:
            if hi <= a or lo >= b:
                nxt.append((a, b))
                continue
            if a < lo:
                nxt.append((a, lo))
            if hi < b:
                nxt.append((hi, b))
        pieces = nxt
    return [Window(a, b) for a, b in pieces if b > a]


def evaluate_day(store: Store, fs: Sequence[Fault], normal: Sequence[Window],
                 config: RankConfig | None = None,
                 topologies: Mapping[str, ServiceMap] | None = None,
                 symptoms: Mapping[str, Symptom] | None = None,
                 peers: bool = False) -> list[FaultResult]:
    """``symptoms``: where each system's users see a fault (``ENTRY``), for symptom-led
    ranking. ``peers``: each fault ranked with the day's other faults of its system as peer
    incidents (``rank(peers=...)``: their anomaly windows, never their truths)."""
    results = []
    for f in fs:
        anomaly, baseline = windows_for(f, fs, normal)
        others = [Window(g.inject_time, g.inject_time + ANOMALY) for g in fs
                  if g is not f and g.system == f.system] if peers else []
        ranked = rank(store, anomaly, baseline, entity="service.name", config=config,
                      topology=(topologies or {}).get(f.system),
                      symptom=(symptoms or {}).get(f.system), peers=others)
        names = [r.entity for r in ranked]
        pos = names.index(f.service) + 1 if f.service in names else None
        results.append(FaultResult(f, pos, ranked[:5]))
    return results


# The service each system's users call, from its documented architecture (the root of its
# traces): the symptom of every fault when the ranking is symptom-led. The corpus names no
# alarm, so the kind is left open (None: whatever moved there).
ENTRY = {"Online Boutique": Symptom("frontend"), "TrainTicket": Symptom("ts-gateway-service")}

SERVICE_MAPS = {"Online Boutique": Path(__file__).with_name("topologies")
                / "online-boutique.yaml"}


def _evaluate_day(root: Path, day: Path, tmp: Path, config: RankConfig | None,
                  signals: frozenset[str],
                  topologies: Mapping[str, ServiceMap] | None,
                  symptoms: Mapping[str, Symptom] | None = None,
                  peers: bool = False) -> list[FaultResult]:
    """One day folder in a store of its own (a process of its own under ``run_nezha``)."""
    construct = root / "construct_data" / day.name
    construct_day = construct if construct.is_dir() else None
    store = Store(tmp / f"{day.name}.duckdb")
    try:
        load_day(store, day, construct_day, signals)
        return evaluate_day(store, faults(day), construct_window(construct_day), config,
                            topologies, symptoms, peers)
    finally:
        store.close()


def run_nezha(root: Path, config: RankConfig | None = None,
              workdir: Path | None = None, signals: frozenset[str] = ALL_SIGNALS,
              topologies: Mapping[str, ServiceMap] | None = None,
              symptoms: Mapping[str, Symptom] | None = None,
              peers: bool = False) -> NezhaReport:
    """Evaluate every day folder under ``root/rca_data``; one store per day, the days in
    parallel (one process per core: loading a day's CSVs is mostly single-threaded Python).
    ``signals`` and ``topologies`` (a declared service map per system) for the metrics-only
    runs."""
    started = time.monotonic()
    days = sorted(p for p in (root / "rca_data").iterdir()
                  if p.is_dir() and (p / f"{p.name}-fault_list.json").is_file())
    systems: dict[str, SystemReport] = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        args = [(root, day, Path(tmp), config, signals, topologies, symptoms, peers)
                for day in days]
        workers = min(len(days), os.cpu_count() or 1)
        if workers <= 1:
            per_day = [_evaluate_day(*a) for a in args]
        else:
            # spawn, not fork: the caller may hold DuckDB or server threads (see nab.detect_all).
            with ProcessPoolExecutor(workers,
                                     mp_context=multiprocessing.get_context("spawn")) as pool:
                per_day = list(pool.map(_evaluate_day, *zip(*args, strict=True)))
        for results in per_day:
            for r in results:
                systems.setdefault(r.fault.system, SystemReport(r.fault.system)).results.append(r)
    return NezhaReport(systems, time.monotonic() - started)


# -- report -----------------------------------------------------------------------------------

def published_rows(path: Path) -> list[tuple[str, dict[str, float]]]:
    """(approach, {"OB_@1": ..}) rows of the published service-level table (Table 3)."""
    rows = []
    with path.open() as fh:
        lines = [line for line in fh if not line.startswith("#")]
    for rec in csv.DictReader(lines):
        if rec.get("table") != "T3_service":
            continue
        vals = {k: float(v) for k, v in rec.items() if k not in ("table", "approach") and v}
        rows.append((rec["approach"], vals))
    return rows


def render(report: NezhaReport, published: Path | None = None) -> str:
    """A Markdown table of AS@1/3/5 per system beside the published rows (percent; the
    published rows cover both days of each system, 56 and 45 faults)."""
    lines = ["| system | approach | faults | AS@1 | AS@3 | AS@5 |", "|---|---|---|---|---|---|"]
    pub = published_rows(published) if published is not None and published.is_file() else []
    for system, rep in report.systems.items():
        lines.append(f"| {system} | aiops rca (this run) | {len(rep.results)} | "
                     f"{100 * rep.at(1):.2f} | {100 * rep.at(3):.2f} | {100 * rep.at(5):.2f} |")
        prefix = _PUBLISHED_PREFIX.get(system)
        for approach, vals in pub:
            if prefix is None or f"{prefix}_@1" not in vals:
                continue
            lines.append(f"| {system} | {approach} (published) | | {vals[f'{prefix}_@1']:.2f} | "
                         f"{vals[f'{prefix}_@3']:.2f} | {vals[f'{prefix}_@5']:.2f} |")
    lines.append("")
    for system, rep in report.systems.items():
        misses = ", ".join(f"{r.fault.inject_time:%H:%M} {r.fault.service} {r.fault.kind} "
                           f"(rank {r.rank or '-'})" for r in rep.results if r.rank != 1)
        lines.append(f"- {system}: fault class right for {100 * rep.class_accuracy():.0f}% "
                     f"of the faults ranked first; not first: {misses or 'none'}.")
    lines.append(f"- {sum(len(r.results) for r in report.systems.values())} faults in "
                 f"{report.seconds:.1f} s.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m aiops_harness.evals.nezha [DATASETS]``: run and print the table."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    datasets = Path(args[0]) if args else DATASETS
    report = run_nezha(datasets / "nezha")
    print(render(report, datasets / "published" / "nezha_fse23_table3_table4.csv"))


if __name__ == "__main__":
    main()

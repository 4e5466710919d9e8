"""Root-cause ranking over the telemetry tables: which entity, and what kind of fault.

Given an anomaly window and a baseline (the period before it, or a known fault-free period),
every candidate entity -- a service, a replica, a model version: any resource attribute -- is
scored by how far its *own* telemetry moved, in units of its baseline's spread:

* **metrics** (BARO-style): per series, the level the anomaly window held for at least half
  its points, away from the baseline median, over the baseline IQR; the metric's name gives
  the fault class (cpu, memory, network, latency, errors).
* **span times**: per operation, the *exclusive* time of its spans (duration minus children),
  so a slow callee does not make its callers look slow. The time a client span spends beyond
  the server span it caused is network/queueing, charged to the end that all the slow edges
  share: the callee, unless one caller is slow towards several callees or slow itself.
* **span structure**: per execution of an operation, which call follows which (from its
  start to its end), and how often an error starts in it rather than under it (errors are
  charged to the deepest erroring span). An early return or a thrown exception stops the
  calls after that point.
* **log transitions**: the same for log templates (drain3) within one span: which template
  follows which, which one an operation starts with. A path the code always took breaks; a
  new error appears after a known record.
* **crash**: calls that used to reach a callee now get no answer span; an entity's share of
  the log records drops to nothing.
* **mesh edges**: per-edge request latency gauges reported by both ends of a call (Istio's
  labels: ``reporter`` source|destination, ``source_workload``, ``destination_workload``),
  for when there are no traces: the caller's view beyond the callee's is network, charged
  as client-span time is; an edge that is no longer reported while its caller goes on is a
  call the caller's code stopped making.

Counts are compared as rates (per execution, per preceding event) so load and request mix
cancel out, and baseline rates are medians over one-minute buckets so a few disturbed
baseline minutes do not move them. An entity's score is its strongest source (weighted, with
diminishing returns); a caller is discounted when a callee it calls scored as high (the
deepest deviating entity is the likelier cause). The same method and parameters serve every
case; the heavy lifting is vectorised SQL in DuckDB.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa

from aiops.analytics.topology import ServiceMap
from aiops.store import Store

__all__ = [
    "Evidence",
    "EvidenceKind",
    "FaultClass",
    "RankConfig",
    "RootCause",
    "Window",
    "metric_family",
    "rank",
]


class FaultClass(StrEnum):
    LATENCY = "latency"
    ERRORS = "errors"
    CPU = "cpu"
    MEMORY = "memory"
    NETWORK = "network"
    CRASH = "crash"


class EvidenceKind(StrEnum):
    TRACE = "trace"
    LOG_TEMPLATE = "log_template"
    METRIC = "metric"


@dataclass(frozen=True)
class Window:
    """A half-open UTC interval [start, end); naive datetimes are taken as UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"empty window {self.start} .. {self.end}")

    @property
    def start_ns(self) -> int:
        return _ns(self.start)

    @property
    def end_ns(self) -> int:
        return _ns(self.end)


@dataclass(frozen=True)
class Evidence:
    """One observation behind a root cause, with the numbers that make it one.

    ``id`` names what was observed: for a trace, a trace in the anomaly window that shows it;
    for a log template, the template text; for a metric, ``name`` (with ``{labels}``), of
    ``entity``. ``signal`` says what was compared (``exclusive_ms:GET /x``,
    ``log:error:A -> B``, ``metric:cpu``), ``observed`` and ``baseline`` are the two values
    and ``score`` the deviation in baseline spreads.
    """

    kind: EvidenceKind
    id: str
    entity: str
    fault_class: FaultClass
    signal: str
    observed: float
    baseline: float
    score: float


@dataclass(frozen=True)
class RootCause:
    entity: str
    fault_class: FaultClass
    confidence: float  # this entity's share of all the scores, 0..1
    score: float
    evidence: list[Evidence] = field(default_factory=list)


# Source weights: resource metrics are the entity's own; latency metrics propagate up the
# call graph and are noisy where traffic is thin; structure and logs are the code that ran.
_WEIGHTS: Mapping[str, float] = {
    "metric:cpu": 1.0, "metric:memory": 1.0, "metric:network": 0.8, "metric:errors": 0.8,
    "metric:latency": 0.2, "metric:other": 0.1,
    "trace:latency": 1.0, "trace:network": 1.0, "trace:structure": 1.0, "log": 1.0,
    "crash": 1.0, "mesh:network": 0.8, "mesh:calls": 0.8,
}


@dataclass(frozen=True)
class RankConfig:
    """The method's parameters: one set for every case of every corpus."""

    # A deviation below this many spreads is noise (it is not evidence at all).
    threshold: float = 3.0
    # Deviations past this many spreads are certain; more only breaks ties.
    z_cap: float = 100.0
    # Spread floors: never narrower than this share of the median (a constant series would
    # turn any wobble into an infinite score), nor than these absolute amounts.
    rel_floor: float = 0.05
    ms_floor: float = 2.0
    eps: float = 1e-9
    # The anomaly window's level for a metric: its (1 - q) and q quantiles (0 is max and
    # min; 0.5 asks for a move held over half the window's points).
    anomaly_q: float = 0.5
    # Least data for a comparison: points per metric series, spans per operation,
    # executions (occurrences of the preceding template) for a rate.
    min_points: int = 3
    min_spans: int = 5
    min_execs: int = 5
    # A rate that rose counts this share of one that fell: data and state drift make new
    # paths common, while a path the code always took and no longer takes is the sharper
    # sign (Nezha ranks vanished patterns only).
    appear_weight: float = 0.5
    # Per-source weights of an entity's evidence; the strongest source is its score, the
    # others add this share of theirs.
    weights: Mapping[str, float] = field(default_factory=lambda: dict(_WEIGHTS))
    corroboration: float = 0.0
    # A caller whose callee scored at least this share of its own score is multiplied by
    # ``caller_discount``: the deviation is likelier the callee's.
    callee_share: float = 1.0
    caller_discount: float = 0.7
    # Log templates: drain3 similarity and depth; templates whose first constant tokens
    # agree are one template (see _Templates).
    drain_sim_th: float = 0.4
    drain_depth: int = 4
    template_lead: int = 6
    # Evidence items kept per root cause.
    max_evidence: int = 8


def rank(db: Store | duckdb.DuckDBPyConnection, anomaly: Window,
         baseline: Window | Sequence[Window], entity: str = "service.name",
         config: RankConfig | None = None, topology: ServiceMap | None = None
         ) -> list[RootCause]:
    """Rank candidate entities as the root cause of what happened in ``anomaly``.

    ``baseline`` is one or more windows of normal behaviour (they must not overlap the
    anomaly). ``entity`` is the resource attribute that identifies a candidate:
    ``service.name``, ``service.instance.id`` (a replica), ``aiops.model.version`` ...
    Entities without any evidence are not listed. ``topology`` adds declared call edges
    (a service map) to those read off spans, for stacks with few or no traces.
    """
    cfg = config or RankConfig()
    base = [baseline] if isinstance(baseline, Window) else list(baseline)
    if not base:
        raise ValueError("rank needs at least one baseline window")
    if any(b.start_ns < anomaly.end_ns and anomaly.start_ns < b.end_ns for b in base):
        raise ValueError("baseline windows must not overlap the anomaly window")
    reader: _Db = _StoreDb(db) if isinstance(db, Store) else _ConnDb(db)
    scope = _Scope(anomaly, base, _entity_sql(entity))
    evidence = _metric_evidence(reader, scope, cfg)
    with _span_facts(reader, scope, cfg) as spans:
        latency = spans.latency_evidence()
        evidence += latency
        evidence += spans.network_evidence({e.entity for e in latency})
        evidence += spans.structure_evidence()
        evidence += spans.crash_evidence()
        edges = spans.call_edges()
    if entity == "service.name":  # mesh workloads are services, not replicas or versions
        evidence += _mesh_evidence(reader, scope, cfg)
    evidence += _log_evidence(reader, scope, cfg)
    evidence += _log_silence_evidence(reader, scope, cfg)
    # Spans without the attribute take part (their time and calls count) but are nobody.
    calls = {(a, b) for a, b in edges if a and b}
    if topology is not None and entity == "service.name":
        calls |= topology.edges
    return _combine([e for e in evidence if e.entity], calls, cfg)


# -- reading ---------------------------------------------------------------------------------

class _Db(Protocol):
    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...

    def arrow(self, sql: str) -> pa.Table: ...


class _StoreDb:
    def __init__(self, store: Store) -> None:
        self._store = store

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._store.query(sql).rows

    def arrow(self, sql: str) -> pa.Table:
        return self._store.query_arrow(sql)


class _ConnDb:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._con.execute(sql).fetchall()

    def arrow(self, sql: str) -> pa.Table:
        return self._con.sql(sql).to_arrow_table()


def _ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


_ATTR = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _entity_sql(attr: str) -> str:
    """SQL for the candidate a row belongs to: ``service.name`` is a column; any other
    attribute is looked up among the resource's attributes, then the row's own (where the
    serving code puts e.g. ``aiops.model.version``)."""
    if attr == "service.name":
        return "service_name"
    if not _ATTR.match(attr):
        raise ValueError(f"not an attribute name: {attr!r}")
    path = f"'$.\"{attr}\"'"
    return (f"coalesce(json_extract_string(resource_attributes, {path}), "
            f"json_extract_string(attributes, {path}))")


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Bucket of anomaly-window counts; baseline buckets are epoch minutes.
_ANOM = -1
_MINUTE_NS = 60_000_000_000
# The event after the last one of a sequence (a span's calls, a span's log records).
_END = "<end>"


@dataclass(frozen=True)
class _Scope:
    anomaly: Window
    baseline: list[Window]
    entity: str

    def phase(self, column: str) -> str:
        """SQL: 1 inside the anomaly window, 0 inside a baseline window, else NULL."""
        base = " OR ".join(self._inside(w, column) for w in self.baseline)
        return f"CASE WHEN {self._inside(self.anomaly, column)} THEN 1 WHEN {base} THEN 0 END"

    def piece(self, column: str) -> str:
        """SQL: which window ``column`` falls in (0 = anomaly, 1.. = baseline), else NULL."""
        cases = " ".join(f"WHEN {self._inside(w, column)} THEN {i}"
                         for i, w in enumerate([self.anomaly, *self.baseline]))
        return f"CASE {cases} END"

    @staticmethod
    def _inside(w: Window, column: str) -> str:
        return (f"({column} >= make_timestamp_ns({w.start_ns}) AND "
                f"{column} < make_timestamp_ns({w.end_ns}))")

    def bucket(self, column: str) -> str:
        """SQL: _ANOM in the anomaly window, the epoch minute in a baseline window."""
        return (f"CASE WHEN {self.phase(column)} = 1 THEN {_ANOM} "
                f"ELSE epoch_ns({column}) // {_MINUTE_NS} END")

    def bounds(self, column: str) -> str:
        lo = min(w.start_ns for w in [self.anomaly, *self.baseline])
        hi = max(w.end_ns for w in [self.anomaly, *self.baseline])
        return (f"{column} >= make_timestamp_ns({lo}) AND "
                f"{column} < make_timestamp_ns({hi})")


# -- metrics ---------------------------------------------------------------------------------

_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cpu", re.compile(r"cpu|throttl")),
    ("memory", re.compile(r"mem|rss|heap|oom")),
    ("errors", re.compile(r"error|fail|exception|5xx|success")),
    ("latency", re.compile(
        r"latenc|duration|(^|_)lat(_|$)|response_time|wait|queue|ongoing|pending|in_?flight")),
    ("network", re.compile(r"net|receive|transmit|bytes_(sent|recv)|packet|tcp|(^|_)[rt]x_")),
    ("traffic", re.compile(r"workload|(^|_)lod$|qps|throughput|requests|(^|\W)ops(\W|$)")),
)

_CLASS_OF_FAMILY = {"cpu": FaultClass.CPU, "memory": FaultClass.MEMORY,
                    "errors": FaultClass.ERRORS, "latency": FaultClass.LATENCY,
                    "network": FaultClass.NETWORK, "other": FaultClass.LATENCY}


def metric_family(name: str) -> str:
    """cpu, memory, errors, latency, network, traffic or other, from a metric's name."""
    low = name.lower()
    for family, pattern in _FAMILIES:
        if pattern.search(low):
            return family
    return "other"


def _metric_evidence(db: _Db, scope: _Scope, cfg: RankConfig) -> list[Evidence]:
    # Cumulative counters become per-second rates and histograms per-interval means; gauges
    # are taken as they are. The spread is the IQR, or a quarter of the 5-95% range when
    # that is wider: quantised series (percentiles from histogram buckets) sit on one value
    # with regular excursions, and such an excursion is not an anomaly.
    sql = f"""
        WITH pts AS (
            SELECT {scope.entity} AS ent, name, coalesce(attributes, '') AS labels, time,
                   type, coalesce(temporality, 'cumulative') AS temporality,
                   coalesce(is_monotonic, false) AS mono, value, sum, count
            FROM metric_points WHERE {scope.bounds('time')}
        ), series AS (
            SELECT ent, name, labels, time, CASE
                WHEN type IN ('histogram', 'exponential_histogram', 'summary') THEN
                    CASE WHEN temporality = 'delta' THEN sum / nullif(count, 0)
                         ELSE (sum - lag(sum) OVER w) / nullif(count - lag(count) OVER w, 0)
                    END
                WHEN type = 'sum' AND mono AND temporality = 'cumulative' THEN
                    (value - lag(value) OVER w)
                    / nullif(epoch(time) - epoch(lag(time) OVER w), 0)
                ELSE value END AS v
            FROM pts WHERE ent IS NOT NULL
            WINDOW w AS (PARTITION BY ent, name, labels ORDER BY time)
        ), ph AS (
            SELECT *, {scope.phase('time')} AS phase FROM series
            WHERE v IS NOT NULL AND isfinite(v)
        ), b AS (
            SELECT ent, name, labels, median(v) AS med,
                   greatest(quantile_cont(v, 0.75) - quantile_cont(v, 0.25),
                            (quantile_cont(v, 0.95) - quantile_cont(v, 0.05)) / 4,
                            {cfg.rel_floor} * abs(median(v)), {cfg.eps}) AS spread
            FROM ph WHERE phase = 0 GROUP BY ALL HAVING count(*) >= {cfg.min_points}
        ), a AS (
            SELECT ent, name, labels, quantile_cont(v, {1 - cfg.anomaly_q}) AS hi,
                   quantile_cont(v, {cfg.anomaly_q}) AS lo
            FROM ph WHERE phase = 1 GROUP BY ALL
        )
        SELECT a.ent, a.name, a.labels, med,
               CASE WHEN hi - med >= med - lo THEN hi ELSE lo END AS level,
               greatest(hi - med, med - lo) / spread AS z
        FROM a JOIN b USING (ent, name, labels)
        WHERE greatest(hi - med, med - lo) / spread >= {cfg.threshold}"""
    out = []
    for ent, name, labels, med, level, z in db.rows(sql):
        family = metric_family(str(name))
        if family == "traffic":
            continue  # load moves with the users, not with the fault
        metric_id = str(name) if labels in ("", "{}") else f"{name}{labels}"
        out.append(Evidence(EvidenceKind.METRIC, metric_id, str(ent), _CLASS_OF_FAMILY[family],
                            f"metric:{family}", float(level), float(med), float(z)))
    return out



# -- mesh edges ------------------------------------------------------------------------------

_EdgeMinutes = dict[tuple[str, str], dict[int, set[int]]]  # edge -> phase -> minutes


def _mesh_evidence(db: _Db, scope: _Scope, cfg: RankConfig) -> list[Evidence]:
    """Evidence from per-edge latency gauges that both ends of a call report (see the module
    docstring); one point per edge, reporter and minute."""
    rows = db.rows(f"""
        WITH p AS (
            SELECT name, attributes->>'source_workload' AS src,
                   attributes->>'destination_workload' AS dst,
                   attributes->>'reporter' AS reporter,
                   value * CASE WHEN unit = 's' THEN 1000 ELSE 1 END AS ms,
                   {scope.phase('time')} AS phase, epoch_ns(time) // {_MINUTE_NS} AS minute
            FROM metric_points
            WHERE {scope.bounds('time')} AND type = 'gauge'
              AND attributes->>'reporter' IN ('source', 'destination')
        )
        SELECT name, src, dst, phase, minute,
               max(ms) FILTER (WHERE reporter = 'source'),
               max(ms) FILTER (WHERE reporter = 'destination')
        FROM p WHERE phase IS NOT NULL AND src IS NOT NULL AND dst IS NOT NULL
        GROUP BY ALL""")
    by_name: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:  # a p50 and a p99 gauge of the same edges are two separate signals
        by_name[str(row[0])].append(row[1:])
    out: list[Evidence] = []
    for name, series in sorted(by_name.items()):
        minutes: dict[int, set[int]] = {0: set(), 1: set()}
        seen: _EdgeMinutes = defaultdict(lambda: {0: set(), 1: set()})
        alive: dict[str, dict[int, set[int]]] = defaultdict(lambda: {0: set(), 1: set()})
        gap: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(
            lambda: {0: [], 1: []})
        for src, dst, phase, minute, by_src, by_dst in series:
            edge, ph, m = (str(src), str(dst)), int(phase), int(minute)
            minutes[ph].add(m)
            seen[edge][ph].add(m)
            # A workload is up in a minute its own end of some edge reported.
            if by_src is not None:
                alive[edge[0]][ph].add(m)
            if by_dst is not None:
                alive[edge[1]][ph].add(m)
            if by_src is not None and by_dst is not None:
                gap[edge][ph].append(float(by_src) - float(by_dst))
        out += _mesh_network(name, gap, cfg)
        out += _mesh_vanished(name, seen, alive, minutes, cfg)
    return out


def _mesh_network(name: str, gap: Mapping[tuple[str, str], Mapping[int, list[float]]],
                  cfg: RankConfig) -> list[Evidence]:
    """The caller's view beyond the callee's, the anomaly window's median against the
    baseline's, in baseline spreads floored as span times are; charged to the callee unless
    one caller is slow towards several callees that nobody else is slow towards."""
    slow = []
    for (src, dst), by in gap.items():
        b, a = by[0], by[1]
        if len(b) < cfg.min_points or len(a) < cfg.min_points:
            continue
        # numpy's default (linear) quantiles are DuckDB's quantile_cont, as in the SQL paths.
        q05, q25, med, q75, q95 = (float(x) for x in np.quantile(b, [.05, .25, .5, .75, .95]))
        level = float(np.median(a))
        spread = max(q75 - q25, (q95 - q05) / 4, cfg.rel_floor * abs(med), cfg.ms_floor)
        if (z := (level - med) / spread) >= cfg.threshold:
            slow.append((src, dst, level, med, z))
    callees_of: dict[str, set[str]] = defaultdict(set)
    callers_of: dict[str, set[str]] = defaultdict(set)
    for src, dst, *_ in slow:
        callees_of[src].add(dst)
        callers_of[dst].add(src)
    return [Evidence(EvidenceKind.METRIC, f"{name}{{{src}->{dst}}}",
                     src if len(callees_of[src]) > 1 and len(callers_of[dst]) == 1 else dst,
                     FaultClass.NETWORK, "mesh:network", level, med, z)
            for src, dst, level, med, z in slow]


def _mesh_vanished(name: str, seen: _EdgeMinutes,
                   alive: Mapping[str, Mapping[int, set[int]]], minutes: Mapping[int, set[int]],
                   cfg: RankConfig) -> list[Evidence]:
    """Edges missing from at least half of the anomaly window's minutes while their caller
    is up then (its own end of some other edge reports), against the share of baseline
    minutes they were there in (a binomial z, shrunk off 0 and 1 by half a count): the
    caller stopped making the call -- an exception or early return before it -- so the
    caller is charged, errors. A caller that is down is not charged here."""
    na, nb = len(minutes[1]), len(minutes[0])
    if na == 0 or nb < cfg.min_execs:
        return []
    out = []
    for (src, dst), by in seen.items():
        missing = minutes[1] - by[1]
        if 2 * len(missing) < na or not missing <= alive.get(src, {}).get(1, set()):
            continue
        rate, now = len(by[0]) / nb, len(by[1]) / na
        p = (rate * nb + 0.5) / (nb + 1.0)
        z = (rate - now) / math.sqrt(p * (1 - p) * (1 / na + 1 / nb))
        if z >= cfg.threshold:
            out.append(Evidence(EvidenceKind.METRIC, f"{name}{{{src}->{dst}}}", src,
                                FaultClass.ERRORS, "mesh:calls", now, rate, z))
    return out


# -- spans -----------------------------------------------------------------------------------

@contextmanager
def _span_facts(db: _Db, scope: _Scope, cfg: RankConfig) -> Iterator[_SpanFacts]:
    facts = _SpanFacts(db, scope, cfg)
    try:
        yield facts
    finally:
        facts.close()


class _SpanFacts:
    """Per-span facts of both phases, read from the store once and then aggregated in a
    private in-memory DuckDB (each question below is one more pass over them)."""

    def __init__(self, db: _Db, scope: _Scope, cfg: RankConfig) -> None:
        self.cfg = cfg
        # Per span: its exclusive time (duration less its children's), the one remote
        # entity it called when all its children are elsewhere (a client span), and whether
        # an error under it started deeper down.
        facts = db.arrow(f"""
            WITH s AS (
                SELECT trace_id, span_id, parent_span_id, name AS op,
                       coalesce({scope.entity}, '') AS ent,
                       coalesce(duration_ns, epoch_ns(end_time) - epoch_ns(start_time))
                           / 1e6 AS ms,
                       coalesce(status_code = 'error', false) AS err,
                       {scope.phase('start_time')} AS phase,
                       {scope.bucket('start_time')} AS bucket, epoch_ns(start_time) AS t,
                       coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns)
                           AS t_end,
                       {scope.piece('start_time')} AS piece
                FROM spans WHERE {scope.bounds('start_time')}
            ), sp AS (
                -- A span that ends after the last span collected in its window may have
                -- children nobody collected: its call sequence is not complete.
                SELECT *, t_end <= max(t) OVER (PARTITION BY piece) AS complete
                FROM s WHERE phase IS NOT NULL
            ),
            k AS (
                SELECT p.trace_id, p.span_id, sum(c.ms) AS child_ms,
                       count(*) FILTER (WHERE c.ent = p.ent) AS local_children,
                       min(c.ent) FILTER (WHERE c.ent <> p.ent) AS remote,
                       count(DISTINCT c.ent) FILTER (WHERE c.ent <> p.ent) AS remotes,
                       bool_or(c.err) AS child_err, count(*) AS children
                FROM sp p JOIN sp c ON c.trace_id = p.trace_id
                    AND c.parent_span_id = p.span_id AND c.phase = p.phase
                GROUP BY p.trace_id, p.span_id
            )
            SELECT sp.trace_id, sp.span_id, sp.parent_span_id, sp.op, sp.ent, sp.err,
                   sp.phase, sp.bucket, sp.t, sp.complete,
                   greatest(sp.ms - coalesce(k.child_ms, 0), 0) AS excl,
                   CASE WHEN k.remotes = 1 AND k.local_children = 0 THEN k.remote END
                       AS callee,
                   coalesce(k.child_err, false) AS child_err,
                   coalesce(k.children, 0) AS children
            FROM sp LEFT JOIN k USING (trace_id, span_id)""")
        self.local = duckdb.connect()
        self.local.execute("SET enable_progress_bar = false")
        self.local.register("f", facts)

    def close(self) -> None:
        self.local.close()

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.local.execute(sql).fetchall()

    def _shifts(self, key: str, where: str) -> list[tuple[Any, ...]]:
        """Per ``key``: anomaly median of exclusive time, baseline median, an example trace
        and the shift in baseline spreads (IQR, floored)."""
        cfg = self.cfg
        return self._rows(f"""
            WITH d AS (SELECT {key}, excl, phase, trace_id FROM f WHERE {where}),
            b AS (SELECT {key}, median(excl) AS med,
                         greatest(quantile_cont(excl, 0.75) - quantile_cont(excl, 0.25),
                                  {cfg.rel_floor} * median(excl), {cfg.ms_floor}) AS spread
                  FROM d WHERE phase = 0 GROUP BY ALL HAVING count(*) >= {cfg.min_spans}),
            a AS (SELECT {key}, median(excl) AS amed, arg_max(trace_id, excl) AS example
                  FROM d WHERE phase = 1 GROUP BY ALL HAVING count(*) >= {cfg.min_points})
            SELECT {key}, amed, med, example, (amed - med) / spread AS z
            FROM a JOIN b USING ({key}) WHERE (amed - med) / spread >= {cfg.threshold}""")

    def latency_evidence(self) -> list[Evidence]:
        """Exclusive time of the spans an entity runs itself (not waiting on a callee)."""
        return [Evidence(EvidenceKind.TRACE, str(example), str(ent), FaultClass.LATENCY,
                         f"exclusive_ms:{op}", float(amed), float(med), float(z))
                for ent, op, amed, med, example, z in self._shifts("ent, op",
                                                                   "callee IS NULL")]

    def network_evidence(self, slow_itself: set[str]) -> list[Evidence]:
        """Client-span time not covered by the callee's server span: network or queueing,
        charged to the callee -- unless one caller is slow towards several callees that
        nobody else is slow towards, or is slow itself while the callee is not."""
        edges = self._shifts("ent, callee, op", "callee IS NOT NULL")
        callees_of: dict[str, set[str]] = defaultdict(set)
        callers_of: dict[str, set[str]] = defaultdict(set)
        for caller, callee, *_ in edges:
            callees_of[str(caller)].add(str(callee))
            callers_of[str(callee)].add(str(caller))
        out = []
        for caller, callee, op, amed, med, example, z in edges:
            caller, callee = str(caller), str(callee)
            fan_out = len(callees_of[caller]) > 1 and len(callers_of[callee]) == 1
            own = caller in slow_itself and callee not in slow_itself
            blame = caller if fan_out or own else callee
            out.append(Evidence(EvidenceKind.TRACE, str(example), blame, FaultClass.NETWORK,
                                f"network_ms:{caller}->{callee}:{op}", float(amed),
                                float(med), float(z)))
        return out

    def structure_evidence(self) -> list[Evidence]:
        """The calls one execution of an operation makes, in order: which call follows
        which (the first follows the operation's start, the last is followed by its end),
        and how often an error starts in it (not under it), against the baseline. A code
        path that returns early or throws stops making the calls after that point."""
        counts = _Counts()
        op_of: dict[tuple[str, str], str] = {}
        for ent, op, a, b, bucket, n, example in self._rows(f"""
                WITH c AS (
                    SELECT p.ent, p.op, p.trace_id, p.span_id, p.bucket, c.t,
                           c.ent || ' ' || c.op AS ev
                    FROM f p JOIN f c ON c.trace_id = p.trace_id
                        AND c.parent_span_id = p.span_id AND c.phase = p.phase
                    WHERE p.complete
                ), seq AS (
                    SELECT ent, op, trace_id, bucket, ev AS b,
                           coalesce(op || ': ' || lag(ev) OVER w, '<start of ' || op || '>')
                               AS a,
                           op || ': ' || ev AS b_head, lead(ev) OVER w IS NULL AS last
                    FROM c WINDOW w AS (PARTITION BY trace_id, span_id ORDER BY t, ev)
                )
                SELECT ent, op, a, b, bucket, count(*), max(trace_id) FROM seq GROUP BY ALL
                UNION ALL
                SELECT ent, op, b_head, {_lit(_END)}, bucket, count(*), max(trace_id) FROM seq
                WHERE last GROUP BY ALL
                UNION ALL
                SELECT ent, op, '<errors of ' || op || '>', 'error', bucket, count(*),
                       max(trace_id)
                FROM f WHERE err AND NOT child_err GROUP BY ALL"""):
            counts.add(str(ent), str(a), str(b), int(bucket), int(n), str(example))
            op_of[(str(ent), str(a))] = str(op)
        execs = {(str(e), str(o), int(b)): int(n) for e, o, b, n in self._rows(
            "SELECT ent, op, bucket, count(*) FROM f WHERE complete GROUP BY ALL")}
        counts.count_silent_executions(execs)
        for (ent, op, bucket), n in execs.items():
            counts.heads[(ent, f"<errors of {op}>")][bucket] = n
        out = []
        for (ent, a, b), z, observed, rate in counts.scored(self.cfg):
            example = counts.example.get((ent, a, b)) or self._example(ent, op_of[(ent, a)])
            kind = "errors" if b == "error" else "calls"
            out.append(Evidence(EvidenceKind.TRACE, example, ent, FaultClass.ERRORS,
                                f"{kind}:{a} -> {b}", observed, rate, z))
        return out

    def _example(self, ent: str, op: str) -> str:
        """A trace of the anomaly window in which ``ent`` ran ``op``."""
        rows = self._rows(f"SELECT max(trace_id) FROM f WHERE phase = 1 AND ent = {_lit(ent)} "
                          f"AND op = {_lit(op)}")
        return str(rows[0][0]) if rows and rows[0][0] is not None else ""

    def crash_evidence(self) -> list[Evidence]:
        """A callee that no longer answers: the client spans that used to reach it (their
        server span their child) go on, but as many more of them end childless as it
        should have answered, and it answered (next to) none."""
        cfg = self.cfg
        rows = self._rows(f"""
            WITH done AS (SELECT * FROM f WHERE complete),
            counted AS (
                SELECT ent, op, coalesce(callee, '') AS callee, count(*) AS n
                FROM done WHERE phase = 0 AND (callee IS NOT NULL OR children = 0)
                GROUP BY ALL
            ), base AS (
                -- Per client operation: which share of its calls reached which callee, and
                -- which share got no answer at all (callee '').
                SELECT ent, op, callee, n / sum(n) OVER (PARTITION BY ent, op) AS share
                FROM counted
            ), client_ops AS (SELECT DISTINCT ent, op FROM base WHERE callee <> ''),
            anom AS (
                SELECT ent, op, count(*) AS n,
                       count(*) FILTER (WHERE children = 0) AS unanswered,
                       max(trace_id) FILTER (WHERE children = 0) AS example
                FROM done JOIN client_ops USING (ent, op) WHERE phase = 1 GROUP BY ALL
            ), answered AS (
                SELECT ent, op, callee, count(*) AS c FROM done
                WHERE phase = 1 AND callee IS NOT NULL GROUP BY ALL
            ), per_op AS (
                SELECT b.callee, b.share * a.n AS expected, coalesce(ans.c, 0) AS answered,
                       a.unanswered - coalesce(nb.share, 0) * a.n AS extra_unanswered,
                       a.example
                FROM base b JOIN anom a USING (ent, op)
                LEFT JOIN answered ans USING (ent, op, callee)
                LEFT JOIN base nb ON nb.ent = b.ent AND nb.op = b.op AND nb.callee = ''
                WHERE b.callee <> ''
            )
            SELECT callee, sum(expected), sum(answered), sum(extra_unanswered), max(example)
            FROM per_op GROUP BY callee
            HAVING sum(expected) >= {cfg.min_execs}
               AND sum(answered) < 0.05 * sum(expected)
               AND sum(extra_unanswered) >= 0.5 * sum(expected)""")
        # The score: calls it should have answered against the Poisson noise of the ones it
        # did answer.
        return [Evidence(EvidenceKind.TRACE, str(example), str(callee), FaultClass.CRASH,
                         "silence:spans", float(answered), float(expected),
                         (expected - answered) / math.sqrt(answered + 1))
                for callee, expected, answered, _, example in rows]

    def call_edges(self) -> set[tuple[str, str]]:
        """Caller -> callee entity pairs seen in either window."""
        rows = self._rows("SELECT DISTINCT ent, callee FROM f WHERE callee IS NOT NULL")
        return {(str(a), str(b)) for a, b in rows}


# -- rates of events following events --------------------------------------------------------

class _Counts:
    """How often event B follows head A, per bucket: ``heads[(ent, A)][bucket]`` and
    ``pairs[(ent, A, B)][bucket]`` (bucket _ANOM holds the anomaly window)."""

    def __init__(self) -> None:
        self.heads: dict[tuple[str, str], dict[int, int]] = defaultdict(
            lambda: defaultdict(int))
        self.pairs: dict[tuple[str, str, str], dict[int, int]] = defaultdict(
            lambda: defaultdict(int))
        self.example: dict[tuple[str, str, str], str] = {}

    def add(self, ent: str, a: str, b: str, bucket: int, n: int = 1, example: str = ""
            ) -> None:
        self.pairs[(ent, a, b)][bucket] += n
        self.heads[(ent, a)][bucket] += n
        if bucket == _ANOM and example:
            self.example.setdefault((ent, a, b), example)

    def count_silent_executions(self, execs: Mapping[tuple[str, str, int], int]) -> None:
        """Executions of an operation head its start transitions, and those that made no
        event at all go from start straight to _END (only for operations seen making one)."""
        for (ent, op, bucket), n in execs.items():
            head = (ent, f"<start of {op}>")
            if head not in self.heads:
                continue
            made = self.heads[head].get(bucket, 0)
            if n > made:
                self.heads[head][bucket] = n
                self.pairs[(*head, _END)][bucket] += n - made

    def usual_next(self, ent: str, head: str) -> str:
        """The event that most often followed ``head`` in the baseline."""
        best, best_n = _END, 0
        for (e, a, b), counts in self.pairs.items():
            n = sum(v for k, v in counts.items() if k != _ANOM)
            if e == ent and a == head and b != _END and n > best_n:
                best, best_n = b, n
        return best

    def scored(self, cfg: RankConfig
               ) -> Iterator[tuple[tuple[str, str, str], float, float, float]]:
        """(key, score, anomaly rate, baseline rate) of every pair past the threshold."""
        for key, counts in self.pairs.items():
            scored = _rate_shift(counts, self.heads[(key[0], key[1])], cfg)
            if scored is not None:
                yield key, *scored


def _rate_shift(counts: Mapping[int, int], heads: Mapping[int, int], cfg: RankConfig
                ) -> tuple[float, float, float] | None:
    """(score, anomaly rate, baseline rate) of B per A, or None below the threshold.

    The baseline rate is the head-weighted median of its minutes' rates. The noise is a
    proportion's (binomial; a count's, Poisson, for rates above one) in both windows, with
    the rate shrunk off 0 and 1 by half a count, plus however much the baseline minutes
    differ among themselves beyond that (a robust spread: disturbed minutes do not widen it).
    A rise counts ``appear_weight`` of a fall.
    """
    na, ca = heads.get(_ANOM, 0), counts.get(_ANOM, 0)
    base = [(counts.get(k, 0) / v, v) for k, v in heads.items() if k != _ANOM and v > 0]
    nb = sum(v for _, v in base)
    if na < cfg.min_execs or nb < cfg.min_execs:
        return None
    rate = _weighted_median(base)
    p = (rate * nb + 0.5) / (nb + 1.0)
    unit = p * (1 - p) if p < 1 else p
    spread = 1.4826 * _weighted_median([(abs(r - rate), v) for r, v in base])
    excess = max(0.0, spread * spread - unit * len(base) / nb)
    observed = ca / na
    z = (observed - rate) / math.sqrt(unit / na + unit / nb + excess)
    if z > 0:
        z *= cfg.appear_weight
    if abs(z) < cfg.threshold:
        return None
    return abs(z), observed, rate


def _weighted_median(values: Iterable[tuple[float, int]]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    half = sum(w for _, w in ordered) / 2
    acc = 0
    for v, w in ordered:
        acc += w
        if acc >= half:
            return v
    return ordered[-1][0]


# -- logs ------------------------------------------------------------------------------------

# Masks applied before template mining (RE2, in DuckDB): ids and numbers, but not numbers
# glued to an identifier (a logger's "Class#123" line number tells statements apart).
_MASKS = (
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<UUID>"),
    (r"\b[0-9a-fA-F]{16,}\b", "<HEX>"),
    (r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b", "<IP>"),
    (r"(^|[^#\w.])[-+]?\d+(\.\d+)?\b", r"\1<NUM>"),
)


def mask_sql(column: str) -> str:
    """SQL that masks ``column`` for template mining."""
    expr = column
    for pattern, token in _MASKS:
        expr = f"regexp_replace({expr}, {_lit(pattern)}, {_lit(token)}, 'g')"
    return expr


def _log_evidence(db: _Db, scope: _Scope, cfg: RankConfig) -> list[Evidence]:
    """Which template follows which in the records one span writes, and which one an
    operation's execution starts with (or ends without any), against the baseline.

    An early return shows as a pair that breaks (A no longer followed by B) or an operation
    that stops logging; an exception as a pair that breaks and a new one (A followed by an
    error). Conditioning on A (on the operation) makes load and request mix cancel out.
    """
    rows = db.rows(f"""
        WITH l AS (
            SELECT {scope.entity} AS ent, coalesce(trace_id, '') AS trace_id,
                   coalesce(span_id, '') AS span_id, epoch_ns(time) AS t,
                   {mask_sql('body')} AS body, coalesce(severity_number, 0) AS sev,
                   {scope.phase('time')} AS phase, {scope.bucket('time')} AS bucket
            FROM logs WHERE {scope.bounds('time')} AND body IS NOT NULL
        ), s0 AS (
            SELECT trace_id, span_id, name, epoch_ns(start_time) AS t,
                   coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns) AS t_end,
                   {scope.piece('start_time')} AS piece
            FROM spans WHERE {scope.bounds('start_time')}
        ), s AS (
            -- Records of a span that outlived the data collected in its window are cut off.
            SELECT trace_id, span_id, any_value(name) AS op,
                   bool_and(t_end <= horizon) AS complete
            FROM (SELECT *, max(t) OVER (PARTITION BY piece) AS horizon FROM s0
                  WHERE piece IS NOT NULL)
            GROUP BY ALL
        )
        SELECT l.ent, l.trace_id, l.span_id, s.op, l.body, l.sev, l.phase, l.bucket
        FROM l LEFT JOIN s ON s.trace_id = l.trace_id AND s.span_id = l.span_id
        WHERE l.phase IS NOT NULL AND l.ent IS NOT NULL AND coalesce(s.complete, true)
        ORDER BY l.ent, l.trace_id, l.span_id, l.t""")
    # An entity whose logs were not collected in the baseline has nothing to compare.
    logged_before: dict[str, int] = defaultdict(int)
    for r in rows:
        logged_before[str(r[0])] += r[6] == 0
    templates = _Templates(cfg)
    walk = _Walk()
    for ent, trace, span, op, body, sev, _phase, bucket in rows:
        if logged_before[str(ent)] < cfg.min_execs:
            continue
        tpl = templates.of(str(body), int(sev))
        start = f"<start of {op}>" if op is not None else None
        walk.add((str(ent), str(trace), str(span)), start, tpl, int(bucket), str(trace))
    walk.close()
    walk.counts.count_silent_executions(_executions(db, scope))
    out = []
    for (ent, a, b), z, observed, rate in walk.counts.scored(cfg):
        # The template the evidence is about: B, or A when the span ended after it, or --
        # when an operation stopped logging altogether -- the one it used to start with.
        shown = b if b != _END else a if not a.startswith("<start of ") else \
            walk.counts.usual_next(ent, a)
        level = "error" if templates.is_error(a) or templates.is_error(b) else "info"
        out.append(Evidence(EvidenceKind.LOG_TEMPLATE, templates.text(shown), ent,
                            FaultClass.ERRORS,
                            f"log:{level}:{_short(templates.text(a))} -> "
                            f"{_short(templates.text(b))}", observed, rate, z))
    return out


class _Walk:
    """Transitions between the templates of one span's records, in time order: the first
    follows ``<start of op>`` of the span's operation, the last is followed by _END.
    Records outside any known span only count transitions between templates."""

    def __init__(self) -> None:
        self.counts = _Counts()
        self._key: tuple[str, str, str] | None = None
        self._prev: str | None = None
        self._bucket = _ANOM

    def add(self, key: tuple[str, str, str], start: str | None, tpl: str, bucket: int,
            trace: str) -> None:
        if key != self._key:
            self.close()
            self._key, self._prev = key, start
        if self._prev is not None:
            self._count(key[0], self._prev, tpl, bucket, trace)
        self._prev, self._bucket = tpl, bucket

    def close(self) -> None:
        if self._key is not None and self._prev is not None:
            self._count(self._key[0], self._prev, _END, self._bucket, self._key[1])
        self._key = None

    def _count(self, ent: str, a: str, b: str, bucket: int, trace: str) -> None:
        self.counts.add(ent, a, b, bucket, 1, trace)


def _executions(db: _Db, scope: _Scope) -> dict[tuple[str, str, int], int]:
    """Complete spans (see _log_evidence) per (entity, operation, bucket)."""
    rows = db.rows(f"""
        SELECT ent, name, bucket, count(*)
        FROM (SELECT {scope.entity} AS ent, name, {scope.bucket('start_time')} AS bucket,
                     coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns)
                         <= max(epoch_ns(start_time)) OVER (PARTITION BY piece) AS complete
              FROM (SELECT *, {scope.piece('start_time')} AS piece FROM spans
                    WHERE {scope.bounds('start_time')})
              WHERE piece IS NOT NULL)
        WHERE complete AND ent IS NOT NULL GROUP BY ALL""")
    return {(str(e), str(o), int(b)): int(n) for e, o, b, n in rows}


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class _Templates:
    """Masked bodies -> template keys: drain3 clusters, merged when their leading constant
    tokens agree (drain keys clusters on token count, so one statement printing a list of
    varying length would otherwise become many templates)."""

    def __init__(self, cfg: RankConfig) -> None:
        from drain3.drain import Drain

        self._drain = Drain(depth=cfg.drain_depth, sim_th=cfg.drain_sim_th,
                            parametrize_numeric_tokens=False)
        self._lead = cfg.template_lead
        self._key: dict[str, str] = {}
        self._text: dict[str, str] = {}
        self._errors: set[str] = set()

    def of(self, masked: str, severity: int) -> str:
        key = self._key.get(masked)
        if key is None:
            cluster, _ = self._drain.add_log_message(masked)
            template = str(cluster.get_template())
            lead = [t for t in template.split() if "<" not in t][: self._lead]
            key = self._key[masked] = " ".join(lead) or template
            self._text.setdefault(key, template)
        if severity >= 17:  # OTLP ERROR and above
            self._errors.add(key)
        return key

    def text(self, key: str) -> str:
        return self._text.get(key, key)

    def is_error(self, key: str) -> bool:
        return key in self._errors


# -- crash -----------------------------------------------------------------------------------

def _log_silence_evidence(db: _Db, scope: _Scope, cfg: RankConfig) -> list[Evidence]:
    """An entity that was writing logs in the baseline and fell silent while the others went
    on: its share of the records, not their count, so a gap in collection as a whole accuses
    nobody. (Spans have their own, sharper test: see _SpanFacts.crash_evidence.)"""
    rows = db.rows(f"""
        SELECT ent, count(*) FILTER (WHERE phase = 1), count(*) FILTER (WHERE phase = 0),
               arg_max(body, t) FILTER (WHERE phase = 0)
        FROM (SELECT {scope.entity} AS ent, body, time AS t, {scope.phase('time')} AS phase
              FROM logs WHERE {scope.bounds('time')})
        WHERE phase IS NOT NULL AND ent IS NOT NULL GROUP BY ALL""")
    total_a, total_b = sum(r[1] for r in rows), sum(r[2] for r in rows)
    out: list[Evidence] = []
    if total_a < cfg.min_execs or total_b < cfg.min_execs:
        return out
    for ent, na, nb, last in rows:
        expected = nb * total_a / total_b
        if expected >= 20 * cfg.min_execs and na < 0.05 * expected:
            out.append(Evidence(EvidenceKind.LOG_TEMPLATE, str(last), str(ent),
                                FaultClass.CRASH, "silence:logs", float(na), expected,
                                (expected - na) / math.sqrt(na + 1)))
    return out


# -- combination -----------------------------------------------------------------------------

def _source(e: Evidence) -> str:
    if e.fault_class is FaultClass.CRASH:
        return "crash"
    if e.kind is EvidenceKind.METRIC:
        return e.signal
    if e.kind is EvidenceKind.LOG_TEMPLATE:
        return "log"
    if e.signal.startswith("exclusive_ms"):
        return "trace:latency"
    if e.signal.startswith("network_ms"):
        return "trace:network"
    return "trace:structure"


def _strength(z: float, cfg: RankConfig, tie_break: bool = True) -> float:
    # Diminishing returns: a score 10x the threshold is not 10x the evidence, and past the
    # cap it only breaks ties.
    z = max(z, 0.0)
    capped = math.log1p(min(z, cfg.z_cap) / cfg.threshold)
    return capped + tie_break * 0.01 * math.log1p(max(z - cfg.z_cap, 0.0) / cfg.z_cap)


def _combine(evidence: Iterable[Evidence], edges: set[tuple[str, str]],
             cfg: RankConfig) -> list[RootCause]:
    by_entity: dict[str, list[Evidence]] = defaultdict(list)
    for e in evidence:
        by_entity[e.entity].append(e)
    scores: dict[str, float] = {}
    saturated: dict[str, float] = {}  # the same without tie-breaks past the cap
    classes: dict[str, FaultClass] = {}
    for ent, items in by_entity.items():
        best: dict[str, Evidence] = {}
        for e in items:
            src = _source(e)
            if src not in best or e.score > best[src].score:
                best[src] = e
        weighted = {src: cfg.weights.get(src, 0.5) * _strength(e.score, cfg)
                    for src, e in best.items()}
        scores[ent] = _entity_score(weighted.values(), cfg)
        saturated[ent] = _entity_score(
            [cfg.weights.get(src, 0.5) * _strength(e.score, cfg, tie_break=False)
             for src, e in best.items()], cfg)
        classes[ent] = _class_of(best, weighted)
    final = dict(scores)
    for caller, callee in edges:
        # Evidence past the cap on both ends is a tie: the callee, deeper, is likelier.
        if (caller != callee and caller in scores and callee in scores
                and saturated[callee] >= cfg.callee_share * saturated[caller]):
            final[caller] = min(final[caller], scores[caller] * cfg.caller_discount)
    total = sum(final.values()) or 1.0
    ranked = sorted(final, key=lambda e: (-final[e], e))
    return [RootCause(ent, classes[ent], final[ent] / total, final[ent],
                      sorted(by_entity[ent], key=lambda e: -e.score)[: cfg.max_evidence])
            for ent in ranked]


def _entity_score(weighted: Iterable[float], cfg: RankConfig) -> float:
    ordered = sorted(weighted, reverse=True)
    return ordered[0] + cfg.corroboration * sum(ordered[1:]) if ordered else 0.0


def _class_of(best: Mapping[str, Evidence], weighted: Mapping[str, float]) -> FaultClass:
    top = max(weighted, key=lambda s: weighted[s])
    # A resource that moved names the class even when other evidence is stronger: a
    # CPU-starved service also slows down and changes its code path (timeouts).
    for source in ("crash", "metric:cpu", "metric:memory"):
        if source in best and weighted[source] >= 0.5 * weighted[top]:
            return best[source].fault_class
    return best[top].fault_class

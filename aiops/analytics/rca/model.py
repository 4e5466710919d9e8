"""The ranker's vocabulary: fault classes, evidence, root causes, windows and its one set of
parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum


class FaultClass(StrEnum):
    LATENCY = "latency"
    ERRORS = "errors"
    CPU = "cpu"
    MEMORY = "memory"
    NETWORK = "network"
    CRASH = "crash"
    NODE = "node"  # the node a replica ran on was lost (its raylet gone)


class EvidenceKind(StrEnum):
    TRACE = "trace"
    LOG_TEMPLATE = "log_template"
    METRIC = "metric"
    EVENT = "event"  # a control-plane event record (logs.event_name), e.g. a node lost


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
class Symptom:
    """Where an incident was seen: the entity whose users saw the fault (the service or model
    whose SLO burns, the node that alarmed) and what they saw (latency or errors; None: read
    off the entity's own evidence, ``symptom.seen_at``)."""

    entity: str
    fault_class: FaultClass | None = None


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
    # Peer incidents (``rank(peers=...)``) needed before their typical level is a reference:
    # the median of fewer is one incident's level, which may be this fault repeated. Fixed
    # before any figure (not tuned).
    min_peers: int = 3
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
    # agree are one template (see rca/logs.py).
    drain_sim_th: float = 0.4
    drain_depth: int = 4
    template_lead: int = 6
    # Evidence items kept per root cause.
    max_evidence: int = 8



def _ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000

"""Detectors and their registry, much as prometheus_client registers collectors.

A detector has a ``name`` and ``findings(ctx)``: what it finds in the store at the round's
``ctx.now_ns``. It owns its thresholds (a frozen dataclass, built once); what it is told from
outside (SLO objectives, this server's ports) comes in when it is made. The analyzer's
``DetectorRegistry`` runs each registered detector once a round; one that fails (an
``AIOpsError``) is counted and logged, and the others still run. Detectors can be registered
and unregistered while the analyzer runs: each round runs those registered when it began.

``Round.shared(key, compute)`` is the round's memo: detectors that need the same query's result
(the kernel rules' per-replica CPU rates, the requests each replica served) run it once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar, cast

from aiops.analytics.findings import Finding
from aiops.analytics.logstream import LogDetector
from aiops.analytics.metric_stream import MetricStream
from aiops.analytics.nodes import node_findings
from aiops.analytics.slo import SLO_BURN, BurnWindow, Objective, burn_findings
from aiops.analytics.traces import TraceThresholds, trace_findings
from aiops.errors import AIOpsError
from aiops.store import Store

__all__ = [
    "Detector",
    "DetectorRegistry",
    "LogTemplateDetector",
    "LogThresholds",
    "MetricStreamDetector",
    "MetricStreamThresholds",
    "NodeDetector",
    "NodeThresholds",
    "Round",
    "SloBurnDetector",
    "SloBurnThresholds",
    "TraceDetector",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Round:
    """One analytics round: the store, the round's time, and its memo of shared results."""

    store: Store
    now_ns: int
    _memo: dict[Hashable, tuple[bool, object]] = field(
        default_factory=dict, repr=False, compare=False)

    def shared(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``'s result, computed once this round for everyone asking by ``key``
        (which must name everything the result depends on besides the store and ``now_ns``).
        A failure (``AIOpsError``) is remembered too: the next detector asking fails the same
        way rather than running a query that just timed out again."""
        try:
            ok, value = self._memo[key]
        except KeyError:
            try:
                ok, value = True, compute()
            except AIOpsError as exc:
                ok, value = False, exc
            self._memo[key] = (ok, value)
        if not ok:
            raise cast(AIOpsError, value)
        return cast(T, value)


class Detector(Protocol):
    name: str

    def findings(self, ctx: Round) -> list[Finding]: ...


class DetectorRegistry:
    """The detectors an analyzer runs, in the order they were registered."""

    def __init__(self, detectors: Iterable[Detector] = ()) -> None:
        self._lock = threading.Lock()
        self._detectors: dict[str, Detector] = {}
        self.failures: dict[str, int] = {}  # detector name -> rounds it failed
        for d in detectors:
            self.register(d)

    def register(self, detector: Detector) -> None:
        with self._lock:
            if detector.name in self._detectors:
                raise ValueError(f"a detector named {detector.name!r} is already registered")
            self._detectors[detector.name] = detector

    def unregister(self, detector: Detector | str) -> None:
        """Remove a detector (or the one of that name); ``KeyError`` if none is registered."""
        name = detector if isinstance(detector, str) else detector.name
        with self._lock:
            if name not in self._detectors:
                raise KeyError(f"no detector named {name!r} is registered")
            del self._detectors[name]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._detectors)

    def get(self, name: str) -> Detector | None:
        with self._lock:
            return self._detectors.get(name)

    def collect(self, ctx: Round) -> list[Finding]:
        """Every detector's findings, in registration order. A detector that fails is counted
        in ``failures`` and logged; the others still report."""
        with self._lock:
            detectors = list(self._detectors.values())
        found: list[Finding] = []
        for d in detectors:
            try:
                found += d.findings(ctx)
            except AIOpsError as exc:
                self.failures[d.name] = self.failures.get(d.name, 0) + 1
                log.warning("detector %s failed: %s", d.name, exc)
        return found


# The detectors whose rules live in their own modules (the kernel's: aiops/analytics/kernel.py).

@dataclass(frozen=True)
class SloBurnThresholds:
    min_requests: int = 5  # in the long window, for a burn rate to mean anything


class SloBurnDetector:
    """SLO burn rates per model version over window pairs (aiops/analytics/slo.py)."""

    name = SLO_BURN

    def __init__(self, objectives: Iterable[Objective], windows: Iterable[BurnWindow],
                 thresholds: SloBurnThresholds | None = None) -> None:
        self.objectives = tuple(objectives)
        self.windows = tuple(windows)
        self.thresholds = thresholds or SloBurnThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        return burn_findings(ctx.store, self.objectives, list(self.windows), ctx.now_ns,
                             self.thresholds.min_requests)


class TraceDetector:
    """Latency and errors per operation against a baseline (aiops/analytics/traces.py);
    ``slow_ms``: per model, the latency its SLO calls slow."""

    name = "traces"

    def __init__(self, thresholds: TraceThresholds | None = None,
                 slow_ms: Mapping[str, float] | None = None) -> None:
        self.thresholds = thresholds or TraceThresholds()
        self.slow_ms: Mapping[str, float] = MappingProxyType(dict(slow_ms or {}))

    @classmethod
    def for_objectives(cls, thresholds: TraceThresholds | None,
                       objectives: Iterable[Objective]) -> TraceDetector:
        """With each objective's latency as its model's slow threshold."""
        return cls(thresholds, {o.model: o.latency_ms for o in objectives if o.latency_ms})

    def findings(self, ctx: Round) -> list[Finding]:
        return trace_findings(ctx.store, ctx.now_ns, self.thresholds, self.slow_ms)


@dataclass(frozen=True)
class LogThresholds:
    bucket_s: float = 10.0
    warmup: int = 6  # buckets
    max_rows: int = 50_000  # log records read a round


class LogTemplateDetector:
    """Log template rates per service (aiops/analytics/logstream.py); ``detector`` keeps the
    templates learned so far (incident context reads them)."""

    name = "logs"

    def __init__(self, thresholds: LogThresholds | None = None) -> None:
        t = self.thresholds = thresholds or LogThresholds()
        self.detector = LogDetector(t.bucket_s, t.warmup, t.max_rows)

    def findings(self, ctx: Round) -> list[Finding]:
        return self.detector.findings(ctx.store, ctx.now_ns)


@dataclass(frozen=True)
class NodeThresholds:
    horizon_s: float = 900.0  # a lost node's replicas not back by then stop being reported


class NodeDetector:
    """Ray nodes lost with replicas not yet replaced (aiops/analytics/nodes.py)."""

    name = "nodes"

    def __init__(self, thresholds: NodeThresholds | None = None) -> None:
        self.thresholds = thresholds or NodeThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        return node_findings(ctx.store, ctx.now_ns, self.thresholds.horizon_s)


@dataclass(frozen=True)
class MetricStreamThresholds:
    lookback_s: float = 600.0  # how far back the first round reads


class MetricStreamDetector:
    """Feeds the metric stream each round. Its anomalies are context for incidents, not
    findings (aiops/analytics/metric_stream.py), so it finds nothing itself."""

    name = "metrics"

    def __init__(self, stream: MetricStream | None = None,
                 thresholds: MetricStreamThresholds | None = None) -> None:
        self.stream = stream if stream is not None else MetricStream()
        self.thresholds = thresholds or MetricStreamThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        self.stream.update(ctx.store, ctx.now_ns, self.thresholds.lookback_s)
        return []

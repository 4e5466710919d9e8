"""The live analyzer: every few seconds, run the detectors over the store, fold their findings
into incidents, gather context for the top cause; the incident tracker appends what changed to
``incidents`` and tells its listeners (remediation, ``tracker.subscribe``).

It runs inside the aiops server (the store's single writer) in a thread of its own. The
detectors are those of ``Analyzer.registry`` (aiops/analytics/detectors.py), built from the
config and open to more at run time; one that fails is logged and counted, and the others still
run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiops.analytics.correlate import context_evidence
from aiops.analytics.detectors import (
    DetectorRegistry,
    LogTemplateDetector,
    MetricStreamDetector,
    NodeDetector,
    Round,
    SloBurnDetector,
    TraceDetector,
)
from aiops.analytics.findings import Finding
from aiops.analytics.incidents import Incident, IncidentTracker
from aiops.analytics.kernel import kernel_detectors
from aiops.analytics.metric_stream import MetricStream
from aiops.analytics.slo import BurnWindow, Objective, parse_windows
from aiops.analytics.topology import ServiceMap, mesh_calls
from aiops.analytics.traces import TraceThresholds
from aiops.periodic import Health, Periodic, PeriodicMetrics
from aiops.store import Store

__all__ = ["Analyzer", "AnalyzerConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnalyzerConfig:
    interval_s: float = 5.0
    windows: tuple[BurnWindow, ...] = field(
        default_factory=lambda: tuple(parse_windows("60/10/6,600/60/3")))
    traces: TraceThresholds = field(default_factory=TraceThresholds)
    resolve_after_s: float = 30.0
    recovered_after_s: float = 10.0  # a mitigating incident's (IncidentTracker)
    objectives: tuple[Objective, ...] = ()
    calls: ServiceMap | None = None  # a declared service map (docs/attach.md)
    # Mesh metrics' source -> destination calls: re-read this often, over this much history.
    mesh_every_s: float = 60.0
    mesh_history_s: float = 900.0
    # This server's ports: retransmits on a replica's telemetry export to it say how busy
    # the observer is, not that the replica's network is faulty.
    own_ports: tuple[int, ...] = ()


@dataclass
class AnalyzerStats:
    rounds: int = 0
    last_round_s: float = 0.0  # how long the last round took (detectors, folding, writes)
    max_round_s: float = 0.0
    findings: int = 0
    incidents_written: int = 0
    detector_failures: dict[str, int] = field(default_factory=dict)


class Analyzer:
    def __init__(self, store: Store, config: AnalyzerConfig,
                 clock: Callable[[], int] = time.time_ns,
                 metrics: PeriodicMetrics | None = None) -> None:
        self.config = config
        self.clock = clock
        # The owner of incidents and the one writer of the table; remediation subscribes.
        self.tracker = IncidentTracker(config.resolve_after_s, calls=config.calls, store=store,
                                       recovered_after_s=config.recovered_after_s)
        self._store = store
        self._calls = config.calls or ServiceMap()  # declared, and Serve's graph once read
        self._mesh = ServiceMap()
        self._mesh_read_ns: int | None = None
        logs = LogTemplateDetector()
        self.logs = logs.detector
        self.metrics = MetricStream()  # context for incidents, not a finding (see its module)
        self.templates = self.logs.templates
        self.registry = self._default_registry(logs)
        # The registry counts its detectors' failures; the stats show the same dict.
        self.stats = AnalyzerStats(detector_failures=self.registry.failures)
        # The analyzer must outlive any one bad round; a failing round backs off at most to
        # twice the interval (detection stays near its cadence while it logs less).
        self._worker = Periodic("analyzer", config.interval_s, self.step, max_backoff=2.0,
                                metrics=metrics)

    @property
    def store(self) -> Store:
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = self.tracker.store = store

    def set_calls(self, calls: ServiceMap) -> None:
        """The calls known from outside the store (a declared map, attached Serve apps'
        deployment graphs); mesh metrics' calls are added each round."""
        self._calls = calls
        self._apply_calls()

    def _apply_calls(self) -> None:
        merged = self._calls | self._mesh
        self.tracker.calls = merged if merged.edges else None

    def _read_mesh(self, now_ns: int) -> None:
        if self._mesh_read_ns is not None and \
                now_ns - self._mesh_read_ns < self.config.mesh_every_s * 1e9:
            return
        self._mesh_read_ns = now_ns
        mesh = mesh_calls(self.store, now_ns - int(self.config.mesh_history_s * 1e9))
        if mesh != self._mesh:
            log.info("mesh calls: %s", ", ".join(f"{a} -> {b}" for a, b in sorted(mesh.edges))
                     or "none")
            self._mesh = mesh
            self._apply_calls()

    def _default_registry(self, logs: LogTemplateDetector) -> DetectorRegistry:
        """The detectors the config calls for: SLO burn (its objectives), traces (their
        latency objectives as floors), the kernel's rules (over the traces' window, this
        server's own ports left out), log templates, lost nodes, and the metric stream."""
        c = self.config
        return DetectorRegistry([
            SloBurnDetector(c.objectives, c.windows),
            TraceDetector.for_objectives(c.traces, c.objectives),
            *kernel_detectors(c.traces.window_s, exclude_peer_ports=c.own_ports),
            logs,
            NodeDetector(),
            MetricStreamDetector(self.metrics),  # context for incidents, finds nothing
        ])

    def detect(self, now_ns: int) -> list[Finding]:
        """Every registered detector's findings at ``now_ns`` (one round of theirs)."""
        return self.registry.collect(Round(self.store, now_ns))

    def step(self, now_ns: int | None = None) -> list[Incident]:
        """One round: detect, fold into incidents, persist what changed."""
        now_ns = now_ns if now_ns is not None else self.clock()
        started = time.perf_counter()
        self._read_mesh(now_ns)
        findings = self.detect(now_ns)

        def context(inc: Incident) -> list[dict[str, Any]]:
            window_ns = int(self.config.traces.window_s * 1e9)
            return context_evidence(self.store, inc.causes[0], now_ns,
                                    self.config.traces.window_s, templates=self.templates) \
                + self.metrics.for_model(inc.causes[0].entity.service, inc.onset_ns - window_ns)

        changed = self.tracker.update(findings, now_ns, context)
        self.stats.rounds += 1
        self.stats.last_round_s = time.perf_counter() - started
        self.stats.max_round_s = max(self.stats.max_round_s, self.stats.last_round_s)
        self.stats.findings += len(findings)
        self.stats.incidents_written += len(changed)
        return changed

    def start(self) -> None:
        self._worker.start()

    def health(self) -> Health:
        return self._worker.health()

    def close(self) -> None:
        self._worker.close(timeout_s=30)

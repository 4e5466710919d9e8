"""Findings from the eBPF collector's metrics, per Serve replica (see docs/ebpf.md).

Four rules, each a detector of its own with its own thresholds:

* ``RunQueueDetector`` (``ebpf_runq``): CPU contention, the replica's run-queue wait per second
  against its own recent past;
* ``CpuUseDetector`` (``cpu_use``, ``cpu_per_request``): its own work got heavier;
* ``MemoryGrowthDetector`` (``rss_growth``): resident memory grew steadily through the window
  (a leak, long before the kernel's OOM kill, which is reported too);
* ``KernelEventsDetector`` (``ebpf_crash``, ``ebpf_memory``, ``ebpf_network``): a replica
  process exited, was OOM-killed, or its sockets retransmitted.

Without the collector their queries find nothing, and the other detectors carry on.
``kernel_findings`` runs the four at once (tests, evaluations).
"""

from __future__ import annotations

from aiops.analytics.detectors import Detector, Round
from aiops.analytics.findings import Finding
from aiops.analytics.kernel_cpu import (
    CpuUseDetector,
    CpuUseThresholds,
    RunQueueDetector,
    RunQueueThresholds,
)
from aiops.analytics.kernel_events import (
    KernelEventsDetector,
    KernelEventsThresholds,
    MemoryGrowthDetector,
    MemoryGrowthThresholds,
)
from aiops.store import Store

__all__ = [
    "CpuUseDetector",
    "CpuUseThresholds",
    "KernelEventsDetector",
    "KernelEventsThresholds",
    "MemoryGrowthDetector",
    "MemoryGrowthThresholds",
    "RunQueueDetector",
    "RunQueueThresholds",
    "kernel_detectors",
    "kernel_findings",
]


def kernel_detectors(window_s: float = 20.0, exclude_peer_ports: tuple[int, ...] = ()
                     ) -> list[Detector]:
    """The four kernel rules at their default thresholds, judging the last ``window_s``;
    events on connections to ``exclude_peer_ports`` (the aiops server's own) left out."""
    return [RunQueueDetector(RunQueueThresholds(window_s=window_s)),
            CpuUseDetector(CpuUseThresholds(window_s=window_s)),
            MemoryGrowthDetector(MemoryGrowthThresholds(window_s=window_s)),
            KernelEventsDetector(KernelEventsThresholds(
                window_s=window_s, exclude_peer_ports=tuple(exclude_peer_ports)))]


def kernel_findings(store: Store, now_ns: int, window_s: float = 20.0,
                    baseline_s: float = 300.0, runq_ratio: float = 3.0,
                    runq_floor_s: float = 0.1, min_history_s: float = 60.0,
                    min_retransmits: int = 5, exclude_peer_ports: tuple[int, ...] = (),
                    rss_growth_mib: float = 64.0, rss_growth_share: float = 0.1,
                    rss_rising: float = 0.8, cpu_ratio: float = 2.0,
                    cpu_floor: float = 0.15, cpu_request_ratio: float = 3.0,
                    cpu_request_floor_s: float = 0.04,
                    min_requests: int = 5, runq_per_cpu: bool = True,
                    runq_slowdown: float = 1.5) -> list[Finding]:
    """The four kernel rules' findings of the last ``window_s``, in one round (their shared
    queries run once): run-queue waits, CPU use, RSS growth, then events. The arguments are
    the rules' thresholds (see each detector's); a rule that fails raises."""
    ctx = Round(store, now_ns)
    detectors: list[Detector] = [
        RunQueueDetector(RunQueueThresholds(
            window_s, baseline_s, min_history_s, ratio=runq_ratio, floor_s=runq_floor_s,
            per_cpu=runq_per_cpu, min_requests=min_requests, slowdown=runq_slowdown)),
        CpuUseDetector(CpuUseThresholds(
            window_s, baseline_s, min_history_s, ratio=cpu_ratio, floor=cpu_floor,
            request_ratio=cpu_request_ratio, request_floor_s=cpu_request_floor_s,
            min_requests=min_requests)),
        MemoryGrowthDetector(MemoryGrowthThresholds(
            window_s, baseline_s, min_history_s, growth_mib=rss_growth_mib,
            growth_share=rss_growth_share, rising=rss_rising)),
        KernelEventsDetector(KernelEventsThresholds(
            window_s, baseline_s, min_retransmits=min_retransmits,
            exclude_peer_ports=tuple(exclude_peer_ports))),
    ]
    return [f for d in detectors for f in d.findings(ctx)]

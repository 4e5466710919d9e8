"""The kernel rules about memory and events, per Serve replica (see aiops/analytics/kernel.py,
docs/ebpf.md): resident memory growing steadily (a leak), and the kernel's events (process
exits, OOM kills, TCP retransmits).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from aiops import semconv
from aiops.analytics.detectors import Round
from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.analytics.kernel_cpu import NS, REPLICA_COLUMNS
from aiops.schema import RETIRED_EVENT

__all__ = ["KernelEventsDetector", "KernelEventsThresholds", "MemoryGrowthDetector",
           "MemoryGrowthThresholds"]

MIB = 2**20

_EVENTS = f"""
SELECT name, {REPLICA_COLUMNS}, (attributes->>'process.pid') AS pid, sum(value) AS n
FROM metric_points
WHERE name IN ('aiops.ebpf.process.exits', 'aiops.ebpf.oom.kills',
               'aiops.ebpf.tcp.retransmits')
  AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
  AND {semconv.MODEL} IS NOT NULL
  -- A replica stopped on purpose (a rollback, a scale-in) exits cleanly or on SIGTERM:
  -- not a crash. (Exits recorded before the status existed have none, and count.)
  AND coalesce(attributes->>'process.exit.status', 'unknown') NOT IN ('clean', 'signal:15')
  -- Nor a replica that announced its retirement first: Serve force-exits a replica it stopped
  -- (ray.kill: exit status 1) once it drained, after a rollback as after a scale-in.
  AND NOT (coalesce({semconv.REPLICA}, '') IN (
      SELECT {semconv.REPLICA} FROM logs
      WHERE event_name = '{RETIRED_EVENT}' AND time > make_timestamp_ns(?)
        AND {semconv.REPLICA} IS NOT NULL))
  AND coalesce(TRY_CAST(attributes->>'network.peer.port' AS INTEGER), -1) <> ALL(?::INTEGER[])
GROUP BY ALL
"""

_RSS = f"""
WITH r AS (
  SELECT {REPLICA_COLUMNS}, (attributes->>'process.pid') AS pid, value, epoch_ns(time) AS t
  FROM metric_points
  WHERE name = 'aiops.process.memory.rss'
    AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
    AND {semconv.MODEL} IS NOT NULL)
SELECT model, version, replica, pid, min(t) AS first_ns,
       list(value ORDER BY t) FILTER (WHERE t > ?) AS recent,
       max(value) FILTER (WHERE t <= ? AND t > born_ns + ?) AS before_max
FROM (SELECT *, min(t) OVER (PARTITION BY model, version, replica, pid) AS born_ns FROM r)
GROUP BY model, version, replica, pid
"""

_EVENT_CLASS = {"aiops.ebpf.process.exits": (FaultClass.CRASH, "replica process exited"),
                "aiops.ebpf.oom.kills": (FaultClass.MEMORY, "OOM-killed"),
                "aiops.ebpf.tcp.retransmits": (FaultClass.NETWORK, "TCP retransmits")}


@dataclass(frozen=True)
class MemoryGrowthThresholds:
    window_s: float = 20.0
    baseline_s: float = 300.0
    min_history_s: float = 60.0  # of readings before the window (and its first, left out)
    growth_mib: float = 64.0
    growth_share: float = 0.1  # of what it held when the climb began
    rising: float = 0.8  # share of the climb's steps upwards


class MemoryGrowthDetector:
    """Resident memory: a replica with ``min_history_s`` of readings whose RSS grew in the
    window by ``growth_mib`` and ``growth_share`` of what it held at the window's start, to as
    much above the most it held before, with at least ``rising`` of the steps upwards (a leak
    climbs; a busy heap goes up and down). Long before the kernel's OOM kill, which
    ``KernelEventsDetector`` reports."""

    name = "kernel_memory"

    def __init__(self, thresholds: MemoryGrowthThresholds | None = None) -> None:
        self.thresholds = thresholds or MemoryGrowthThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        t = self.thresholds
        now_ns = ctx.now_ns
        cur = now_ns - int(t.window_s * NS)
        found = []
        for model, version, replica, pid, first_ns, recent, before_max in ctx.store.query(
                _RSS, [now_ns - int(t.baseline_s * NS), now_ns, cur, cur,
                       int(t.min_history_s * NS)]).rows:
            values = [float(v) for v in recent or () if v is not None]
            if (cur - int(first_ns)) / NS < t.min_history_s or len(values) < 3 \
                    or before_max is None:
                continue
            # The climb is the longest run at the window's end with ``rising`` of its steps
            # upwards: a leak that began mid-window shows as soon as it has grown enough, not
            # once it fills the window.
            start = next((i for i in range(len(values) - 2)
                          if sum(b > a for a, b in itertools.pairwise(values[i:]))
                          >= t.rising * (len(values) - i - 1)), None)
            if start is None:
                continue
            climb = values[start:]
            grown = climb[-1] - climb[0]
            need = max(t.growth_mib * MIB, t.growth_share * climb[0])
            # Beyond anything it held before, too (its first minute, loading weights, left
            # out): a model whose requests allocate and free hundreds of MiB (an OCR pipeline)
            # climbs within its usual range on every request.
            if grown < need or climb[-1] - float(before_max) < need:
                continue
            entity = Entity(model, version, replica)
            score = grown / need
            found.append(Finding(
                "rss_growth", entity, FaultClass.MEMORY, score, cur, now_ns,
                f"{entity}: resident memory grew {grown / MIB:.0f} MiB in {len(climb)} "
                f"readings (to {climb[-1] / MIB:.0f} MiB, pid {pid})",
                [entity.evidence(EvidenceKind.METRIC, "aiops.process.memory.rss",
                                 FaultClass.MEMORY, "rss_mib", climb[-1] / MIB,
                                 climb[0] / MIB, score)]))
        return found


@dataclass(frozen=True)
class KernelEventsThresholds:
    window_s: float = 20.0
    baseline_s: float = 300.0  # how far back a replica's retirement announcement counts
    min_retransmits: int = 5  # in the window; fewer are the network's everyday noise
    # Connections to these ports (the aiops server's own) are left out: retransmits on a
    # replica's telemetry export say how busy the observer is.
    exclude_peer_ports: tuple[int, ...] = ()


class KernelEventsDetector:
    """A crash (a replica process exited, not on purpose), an OOM kill, TCP retransmits of a
    replica's sockets (``min_retransmits`` in the window, not the everyday few)."""

    name = "kernel_events"

    def __init__(self, thresholds: KernelEventsThresholds | None = None) -> None:
        self.thresholds = thresholds or KernelEventsThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        t = self.thresholds
        cur = ctx.now_ns - int(t.window_s * NS)
        since = ctx.now_ns - int(t.baseline_s * NS)
        found = []
        for name, model, version, replica, pid, n in ctx.store.query(
                _EVENTS, [cur, ctx.now_ns, since, list(t.exclude_peer_ports)]).rows:
            fault, what = _EVENT_CLASS[name]
            score = float(n)
            if fault is FaultClass.NETWORK:
                if n < t.min_retransmits:
                    continue
                score = float(n) / t.min_retransmits
            entity = Entity(model, version, replica)
            found.append(Finding(
                f"ebpf_{fault}", entity, fault, score, cur, ctx.now_ns,
                f"{entity}: {what} (pid {pid}, {n:g}x)",
                [entity.evidence(EvidenceKind.METRIC, name, fault, "events", float(n), 0.0,
                                 score)]))
        return found

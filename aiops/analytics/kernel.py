"""Findings from the eBPF collector's metrics, per Serve replica (see docs/ebpf.md).

CPU contention: the replica's run-queue wait per second against its own recent past. A crash:
a replica process exited. Memory: the kernel OOM-killed a process. Network: TCP retransmits
of a replica's sockets. Without the collector these queries find nothing, and the other
detectors carry on.
"""

from __future__ import annotations

from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.store import Store

__all__ = ["kernel_findings"]

NS = 1_000_000_000

_REPLICA = ("attributes->>'gen_ai.request.model' AS model, "
            "attributes->>'aiops.model.version' AS version, "
            "attributes->>'ray.serve.replica' AS replica")

_RUNQ = f"""
SELECT {_REPLICA},
       sum(sum) FILTER (WHERE epoch_ns(time) > ?) AS now_s,
       sum(sum) FILTER (WHERE epoch_ns(time) <= ?) AS before_s,
       min(epoch_ns(time)) AS first_ns
FROM metric_points
WHERE name = 'aiops.ebpf.runq.latency' AND epoch_ns(time) > ?
  AND attributes->>'gen_ai.request.model' IS NOT NULL
GROUP BY ALL
"""

_EVENTS = f"""
SELECT name, {_REPLICA}, attributes->>'process.pid' AS pid, sum(value) AS n
FROM metric_points
WHERE name IN ('aiops.ebpf.process.exits', 'aiops.ebpf.oom.kills',
               'aiops.ebpf.tcp.retransmits')
  AND epoch_ns(time) > ? AND attributes->>'gen_ai.request.model' IS NOT NULL
  -- A replica stopped on purpose (a rollback, a scale-in) exits cleanly or on SIGTERM:
  -- not a crash. (Exits recorded before the status existed have none, and count.)
  AND coalesce(attributes->>'process.exit.status', 'unknown') NOT IN ('clean', 'signal:15')
GROUP BY ALL
"""

_EVENT_CLASS = {"aiops.ebpf.process.exits": (FaultClass.CRASH, "replica process exited"),
                "aiops.ebpf.oom.kills": (FaultClass.MEMORY, "OOM-killed"),
                "aiops.ebpf.tcp.retransmits": (FaultClass.NETWORK, "TCP retransmits")}


def kernel_findings(store: Store, now_ns: int, window_s: float = 20.0,
                    baseline_s: float = 300.0, runq_ratio: float = 3.0,
                    runq_floor_s: float = 0.1, min_history_s: float = 60.0,
                    min_retransmits: int = 5) -> list[Finding]:
    """Findings of the last ``window_s``. Run-queue waits are judged against the replica's
    own past, and only once it has ``min_history_s`` of it: a replica that just started (or
    a stack that is still loading its models) has no normal to compare with. A few TCP
    retransmits are the network's everyday noise; ``min_retransmits`` in the window are not."""
    cur = now_ns - int(window_s * NS)
    found = []
    for model, version, replica, now_s, before_s, first_ns in store.query(
            _RUNQ, [cur, cur, now_ns - int(baseline_s * NS)]).rows:
        history_s = (cur - max(int(first_ns), now_ns - int(baseline_s * NS))) / NS
        if history_s < min_history_s:
            continue
        per_s_now = float(now_s or 0) / window_s
        per_s_before = float(before_s or 0) / history_s
        if per_s_now < runq_floor_s or per_s_now < runq_ratio * max(per_s_before, 1e-3):
            continue
        entity = Entity(model, version, replica)
        score = per_s_now / max(per_s_before, 1e-3) / runq_ratio
        found.append(Finding(
            "ebpf_runq", entity, FaultClass.CPU, score, cur, now_ns,
            f"{entity} waited {per_s_now * 1e3:.0f} ms per second for a CPU "
            f"(was {per_s_before * 1e3:.0f} ms/s)",
            [entity.evidence(EvidenceKind.METRIC, "aiops.ebpf.runq.latency", FaultClass.CPU,
                             "runq_wait_s_per_s", per_s_now, per_s_before, score)]))
    for name, model, version, replica, pid, n in store.query(_EVENTS, [cur]).rows:
        fault, what = _EVENT_CLASS[name]
        score = float(n)
        if fault is FaultClass.NETWORK:
            if n < min_retransmits:
                continue
            score = float(n) / min_retransmits
        entity = Entity(model, version, replica)
        found.append(Finding(
            f"ebpf_{fault}", entity, fault, score, cur, now_ns,
            f"{entity}: {what} (pid {pid}, {n:g}x)",
            [entity.evidence(EvidenceKind.METRIC, name, fault, "events", float(n), 0.0,
                             score)]))
    return found

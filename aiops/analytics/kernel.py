"""Findings from the eBPF collector's metrics, per Serve replica (see docs/ebpf.md).

CPU contention: the replica's run-queue wait per second against its own recent past. A crash:
a replica process exited. Memory: the replica's resident memory grew steadily through the window
(a leak, long before the kernel's OOM kill, which is reported too). Network: TCP retransmits
of a replica's sockets. Without the collector these queries find nothing, and the other
detectors carry on.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from aiops.analytics.findings import NOT_WARMUP, Entity, EvidenceKind, FaultClass, Finding
from aiops.schema import RETIRED_EVENT
from aiops.store import Store

__all__ = ["kernel_findings"]

NS = 1_000_000_000

_REPLICA = ("attributes->>'gen_ai.request.model' AS model, "
            "attributes->>'aiops.model.version' AS version, "
            "attributes->>'ray.serve.replica' AS replica")

# Seconds per second of a replica, now and before: run-queue waits (a histogram's sum) or the
# CPU time it used (a delta counter's value).
_RATE = f"""
SELECT {_REPLICA},
       sum(coalesce(sum, value)) FILTER (WHERE epoch_ns(time) > ?) AS now_s,
       sum(coalesce(sum, value)) FILTER (WHERE epoch_ns(time) <= ?) AS before_s,
       min(epoch_ns(time)) AS first_ns
FROM metric_points
WHERE name = ? AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
  AND attributes->>'gen_ai.request.model' IS NOT NULL
GROUP BY ALL
"""

_EVENTS = f"""
SELECT name, {_REPLICA}, attributes->>'process.pid' AS pid, sum(value) AS n
FROM metric_points
WHERE name IN ('aiops.ebpf.process.exits', 'aiops.ebpf.oom.kills',
               'aiops.ebpf.tcp.retransmits')
  AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
  AND attributes->>'gen_ai.request.model' IS NOT NULL
  -- A replica stopped on purpose (a rollback, a scale-in) exits cleanly or on SIGTERM:
  -- not a crash. (Exits recorded before the status existed have none, and count.)
  AND coalesce(attributes->>'process.exit.status', 'unknown') NOT IN ('clean', 'signal:15')
  -- Nor a replica that announced its retirement first: Serve force-exits a replica it stopped
  -- (ray.kill: exit status 1) once it drained, after a rollback as after a scale-in.
  AND NOT (coalesce(attributes->>'ray.serve.replica', '') IN (
      SELECT resource_attributes->>'ray.serve.replica' FROM logs
      WHERE event_name = '{RETIRED_EVENT}' AND time > make_timestamp_ns(?)
        AND resource_attributes->>'ray.serve.replica' IS NOT NULL))
  AND coalesce(TRY_CAST(attributes->>'network.peer.port' AS INTEGER), -1) <> ALL(?::INTEGER[])
GROUP BY ALL
"""

_RSS = f"""
WITH r AS (
  SELECT {_REPLICA}, attributes->>'process.pid' AS pid, value, epoch_ns(time) AS t
  FROM metric_points
  WHERE name = 'aiops.process.memory.rss'
    AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
    AND attributes->>'gen_ai.request.model' IS NOT NULL)
SELECT model, version, replica, pid, min(t) AS first_ns,
       list(value ORDER BY t) FILTER (WHERE t > ?) AS recent,
       max(value) FILTER (WHERE t <= ? AND t > born_ns + ?) AS before_max
FROM (SELECT *, min(t) OVER (PARTITION BY model, version, replica, pid) AS born_ns FROM r)
GROUP BY model, version, replica, pid
"""
# Requests each replica served (one span per request carries its replica), now and before,
# and their median duration.
_REQUESTS = f"""
SELECT resource_attributes->>'ray.serve.replica' AS replica,
       count(*) FILTER (WHERE epoch_ns(end_time) > ?) AS now_n,
       count(*) FILTER (WHERE epoch_ns(end_time) <= ?) AS before_n,
       median(duration_ns) FILTER (WHERE epoch_ns(end_time) > ?) AS now_med,
       median(duration_ns) FILTER (WHERE epoch_ns(end_time) <= ?) AS before_med
FROM spans
WHERE end_time > make_timestamp_ns(?) AND end_time <= make_timestamp_ns(?)
  AND resource_attributes->>'ray.serve.replica' IS NOT NULL AND {NOT_WARMUP}
GROUP BY ALL
"""
MIB = 2**20


class _Served(NamedTuple):
    now_n: int
    before_n: int
    now_med: float  # ns
    before_med: float

_EVENT_CLASS = {"aiops.ebpf.process.exits": (FaultClass.CRASH, "replica process exited"),
                "aiops.ebpf.oom.kills": (FaultClass.MEMORY, "OOM-killed"),
                "aiops.ebpf.tcp.retransmits": (FaultClass.NETWORK, "TCP retransmits")}


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
    """Findings of the last ``window_s``. Run-queue waits (per CPU-second the replica ran,
    where its CPU time is read; ``runq_per_cpu``) are judged against the replica's
    own past, and only once it has ``min_history_s`` of it: a replica that just started (or
    a stack that is still loading its models) has no normal to compare with. Where the
    replica's requests are seen (spans carry it), the waits must also have slowed them: a
    median ``runq_slowdown`` times its past over ``min_requests`` or more now and before (a
    replica that waited while serving nothing, or a couple of requests at their usual speed,
    cost its users nothing; the busy moment was someone else's). A few TCP
    retransmits are the network's everyday noise; ``min_retransmits`` in the window are not.
    Events on connections to ``exclude_peer_ports`` (the aiops server's own) are left out.
    Resident memory: a replica with ``min_history_s`` of readings whose RSS grew in the window
    by ``rss_growth_mib`` and ``rss_growth_share`` of what it held at the window's start, to as
    much above the most it held before, with at least ``rss_rising`` of the steps upwards (a
    leak climbs; a busy heap goes up and down).
    CPU use (its own work got heavier, contended or not), per request: ``cpu_request_ratio``
    times the CPU seconds per request it used to, and ``cpu_request_floor_s`` more, over at
    least ``min_requests`` requests now and before. That holds when a starved replica serves
    fewer requests (its CPU per second barely moves), and neither a traffic surge (more
    requests at the usual cost) nor a low-rate model's heavy requests arriving together trip
    it. A replica serving nothing in the window is judged per second: ``cpu_ratio`` times the
    CPU per second it used to, and ``cpu_floor`` of a core more.
    """
    cur = now_ns - int(window_s * NS)
    since = now_ns - int(baseline_s * NS)
    found = []

    def rates(name: str) -> list[tuple[Entity, float, float, float]]:
        """(entity, seconds now, seconds before, seconds of history before the window)."""
        out = []
        for model, version, replica, now_s, before_s, first_ns in store.query(
                _RATE, [cur, cur, name, since, now_ns]).rows:
            history_s = (cur - max(int(first_ns), since)) / NS
            if history_s >= min_history_s:
                out.append((Entity(model, version, replica), float(now_s or 0),
                            float(before_s or 0), history_s))
        return out

    cpu = rates("aiops.process.cpu.time")
    runq = rates("aiops.ebpf.runq.latency")
    used = {entity: (now_s, before_s) for entity, now_s, before_s, _ in cpu}
    # Only where there is something to judge: the query scans the baseline's spans.
    served = {r: _Served(int(n), int(b), float(m or 0), float(bm or 0)) for r, n, b, m, bm
              in store.query(_REQUESTS, [cur, cur, cur, cur, since, now_ns]).rows
              } if cpu or runq else {}
    for entity, now_s, before_s, history_s in runq:
        per_s_now, per_s_before = now_s / window_s, before_s / history_s
        ratio = per_s_now / max(per_s_before, 1e-3)
        if per_s_now < runq_floor_s or ratio < runq_ratio:
            continue
        if entity in used and runq_per_cpu:
            # And per CPU-second it ran: a replica whose own work got busier (a
            # multi-threaded OCR request on 2 cores) waits more because it runs more; a
            # starved one waits more for each second it gets.
            cpu_now, cpu_before = used[entity]
            per_cpu = (now_s / max(cpu_now, 1e-2)) / max(before_s / max(cpu_before, 1e-2),
                                                         1e-3)
            if per_cpu < runq_ratio:
                continue
            ratio = min(ratio, per_cpu)
        seen = served.get(entity.replica or "")
        if seen is not None and (min(seen.now_n, seen.before_n) < min_requests
                                 or seen.now_med < runq_slowdown * seen.before_med):
            continue
        score = ratio / runq_ratio
        found.append(Finding(
            "ebpf_runq", entity, FaultClass.CPU, score, cur, now_ns,
            f"{entity} waited {per_s_now * 1e3:.0f} ms per second for a CPU "
            f"(was {per_s_before * 1e3:.0f} ms/s)",
            [entity.evidence(EvidenceKind.METRIC, "aiops.ebpf.runq.latency", FaultClass.CPU,
                             "runq_wait_s_per_s", per_s_now, per_s_before, score)]))
    for entity, now_s, before_s, history_s in cpu:
        seen = served.get(entity.replica or "")
        n_now, n_before = (seen.now_n, seen.before_n) if seen else (0, 0)
        if n_now == 0:
            # Serving nothing, yet burning CPU: per second is all there is to judge by.
            per_s_now, per_s_before = now_s / window_s, before_s / history_s
            if per_s_now - per_s_before < cpu_floor or per_s_now < cpu_ratio * per_s_before:
                continue
            score = per_s_now / max(per_s_before, 1e-3) / cpu_ratio
            found.append(Finding(
                "cpu_use", entity, FaultClass.CPU, score, cur, now_ns,
                f"{entity} used {per_s_now:.2f} CPU-seconds per second serving no requests "
                f"(was {per_s_before:.2f})",
                [entity.evidence(EvidenceKind.METRIC, "aiops.process.cpu.time",
                                 FaultClass.CPU, "cpu_s_per_s", per_s_now, per_s_before,
                                 score)]))
            continue
        # Serving: judged per request, over enough of them. A few heavy requests of a
        # low-rate model (OCR) in one window are its usual work arriving together.
        if n_now < min_requests or n_before < min_requests:
            continue
        per_req_now, per_req_before = now_s / n_now, before_s / n_before
        if (per_req_now - per_req_before < cpu_request_floor_s
                or per_req_now < cpu_request_ratio * per_req_before):
            continue
        score = per_req_now / max(per_req_before, 1e-4) / cpu_request_ratio
        found.append(Finding(
            "cpu_per_request", entity, FaultClass.CPU, score, cur, now_ns,
            f"{entity} used {per_req_now * 1e3:.0f} ms of CPU per request over {n_now} "
            f"requests (was {per_req_before * 1e3:.0f} ms)",
            [entity.evidence(EvidenceKind.METRIC, "aiops.process.cpu.time", FaultClass.CPU,
                             "cpu_s_per_request", per_req_now, per_req_before, score)]))
    found += _rss_growth(store, now_ns, cur, baseline_s, min_history_s, rss_growth_mib,
                         rss_growth_share, rss_rising)
    events = store.query(_EVENTS, [cur, now_ns, since, list(exclude_peer_ports)]).rows
    for name, model, version, replica, pid, n in events:
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


def _rss_growth(store: Store, now_ns: int, cur: int, baseline_s: float, min_history_s: float,
                growth_mib: float, growth_share: float, rising: float) -> list[Finding]:
    found = []
    for model, version, replica, pid, first_ns, recent, before_max in store.query(
            _RSS, [now_ns - int(baseline_s * NS), now_ns, cur, cur,
                   int(min_history_s * NS)]).rows:
        values = [float(v) for v in recent or () if v is not None]
        if (cur - int(first_ns)) / NS < min_history_s or len(values) < 3 or before_max is None:
            continue
        # The climb is the longest run at the window's end with ``rising`` of its steps
        # upwards: a leak that began mid-window shows as soon as it has grown enough, not
        # once it fills the window.
        start = next((i for i in range(len(values) - 2)
                      if sum(b > a for a, b in itertools.pairwise(values[i:]))
                      >= rising * (len(values) - i - 1)), None)
        if start is None:
            continue
        climb = values[start:]
        grown = climb[-1] - climb[0]
        need = max(growth_mib * MIB, growth_share * climb[0])
        # Beyond anything it held before, too (its first minute, loading weights, left out):
        # a model whose requests allocate and free hundreds of MiB (an OCR pipeline) climbs
        # within its usual range on every request.
        if grown < need or climb[-1] - float(before_max) < need:
            continue
        entity = Entity(model, version, replica)
        score = grown / need
        found.append(Finding(
            "rss_growth", entity, FaultClass.MEMORY, score, cur, now_ns,
            f"{entity}: resident memory grew {grown / MIB:.0f} MiB in {len(climb)} readings "
            f"(to {climb[-1] / MIB:.0f} MiB, pid {pid})",
            [entity.evidence(EvidenceKind.METRIC, "aiops.process.memory.rss", FaultClass.MEMORY,
                             "rss_mib", climb[-1] / MIB, climb[0] / MIB, score)]))
    return found

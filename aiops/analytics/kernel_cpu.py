"""The kernel rules about CPU, per Serve replica (see aiops/analytics/kernel.py, docs/ebpf.md):
run-queue wait (contention) and CPU use (its own work got heavier).

Both read each replica's CPU time per second and the requests it served; those queries are the
round's shared results (``Round.shared``), run once for both rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from aiops import semconv
from aiops.analytics.detectors import Round
from aiops.analytics.findings import NOT_WARMUP, Entity, EvidenceKind, FaultClass, Finding

__all__ = ["CpuUseDetector", "CpuUseThresholds", "RunQueueDetector", "RunQueueThresholds"]

NS = 1_000_000_000

REPLICA_COLUMNS = (f"{semconv.MODEL} AS model, {semconv.VERSION} AS version, "
                   f"{semconv.REPLICA} AS replica")

# Seconds per second of a replica, now and before: run-queue waits (a histogram's sum) or the
# CPU time it used (a delta counter's value).
_RATE = f"""
SELECT {REPLICA_COLUMNS},
       sum(coalesce(sum, value)) FILTER (WHERE epoch_ns(time) > ?) AS now_s,
       sum(coalesce(sum, value)) FILTER (WHERE epoch_ns(time) <= ?) AS before_s,
       min(epoch_ns(time)) AS first_ns
FROM metric_points
WHERE name = ? AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
  AND {semconv.MODEL} IS NOT NULL
GROUP BY ALL
"""

# Requests each replica served (one span per request carries its replica), now and before,
# and their median duration.
_REQUESTS = f"""
SELECT {semconv.REPLICA} AS replica,
       count(*) FILTER (WHERE epoch_ns(end_time) > ?) AS now_n,
       count(*) FILTER (WHERE epoch_ns(end_time) <= ?) AS before_n,
       median(duration_ns) FILTER (WHERE epoch_ns(end_time) > ?) AS now_med,
       median(duration_ns) FILTER (WHERE epoch_ns(end_time) <= ?) AS before_med
FROM spans
WHERE end_time > make_timestamp_ns(?) AND end_time <= make_timestamp_ns(?)
  AND {semconv.REPLICA} IS NOT NULL AND {NOT_WARMUP}
GROUP BY ALL
"""

CPU_TIME = "aiops.process.cpu.time"
RUNQ_LATENCY = "aiops.ebpf.runq.latency"


class Rate(NamedTuple):
    entity: Entity
    now_s: float  # seconds (of waiting, of CPU) in the window
    before_s: float  # ...and in the baseline before it
    history_s: float  # seconds of history before the window


class Served(NamedTuple):
    now_n: int
    before_n: int
    now_med: float  # ns
    before_med: float


def replica_rates(ctx: Round, name: str, window_s: float, baseline_s: float,
                  min_history_s: float) -> list[Rate]:
    """Per replica with ``min_history_s`` of history, seconds per second of ``name``."""
    cur = ctx.now_ns - int(window_s * NS)
    since = ctx.now_ns - int(baseline_s * NS)
    rows: list[tuple[Any, ...]] = ctx.shared(
        ("kernel.rates", name, cur, since),
        lambda: ctx.store.query(_RATE, [cur, cur, name, since, ctx.now_ns]).rows)
    out = []
    for model, version, replica, now_s, before_s, first_ns in rows:
        history_s = (cur - max(int(first_ns), since)) / NS
        if history_s >= min_history_s:
            out.append(Rate(Entity(model, version, replica), float(now_s or 0),
                            float(before_s or 0), history_s))
    return out


def served_requests(ctx: Round, window_s: float, baseline_s: float) -> dict[str, Served]:
    """Per replica, the requests it served (asked only where there is something to judge:
    the query scans the baseline's spans)."""
    cur = ctx.now_ns - int(window_s * NS)
    since = ctx.now_ns - int(baseline_s * NS)

    def query() -> dict[str, Served]:
        return {r: Served(int(n), int(b), float(m or 0), float(bm or 0)) for r, n, b, m, bm
                in ctx.store.query(_REQUESTS, [cur, cur, cur, cur, since, ctx.now_ns]).rows}

    return ctx.shared(("kernel.served", cur, since), query)


@dataclass(frozen=True)
class RunQueueThresholds:
    window_s: float = 20.0
    baseline_s: float = 300.0
    min_history_s: float = 60.0  # of the replica's own past, before it is judged
    ratio: float = 3.0  # waits per second against its past (and per CPU-second, per_cpu)
    floor_s: float = 0.1  # seconds of waiting per second, at least
    per_cpu: bool = True  # also per CPU-second it ran, where its CPU time is read
    min_requests: int = 5  # now and before, for its requests' slowdown to count
    slowdown: float = 1.5  # its requests' median against their past


class RunQueueDetector:
    """CPU contention: run-queue waits (per CPU-second the replica ran, where its CPU time is
    read; ``per_cpu``) judged against the replica's own past, and only once it has
    ``min_history_s`` of it: a replica that just started (or a stack that is still loading its
    models) has no normal to compare with. Where the replica's requests are seen (spans carry
    it), the waits must also have slowed them: a median ``slowdown`` times its past over
    ``min_requests`` or more now and before (a replica that waited while serving nothing, or a
    couple of requests at their usual speed, cost its users nothing; the busy moment was
    someone else's)."""

    name = "kernel_runq"

    def __init__(self, thresholds: RunQueueThresholds | None = None) -> None:
        self.thresholds = thresholds or RunQueueThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        t = self.thresholds
        cur = ctx.now_ns - int(t.window_s * NS)
        found = []
        used: dict[Entity, tuple[float, float]] | None = None  # CPU seconds, once needed
        for entity, now_s, before_s, history_s in replica_rates(
                ctx, RUNQ_LATENCY, t.window_s, t.baseline_s, t.min_history_s):
            per_s_now, per_s_before = now_s / t.window_s, before_s / history_s
            ratio = per_s_now / max(per_s_before, 1e-3)
            if per_s_now < t.floor_s or ratio < t.ratio:
                continue
            if used is None:
                used = {r.entity: (r.now_s, r.before_s) for r in replica_rates(
                    ctx, CPU_TIME, t.window_s, t.baseline_s, t.min_history_s)
                    } if t.per_cpu else {}
            if entity in used:
                # And per CPU-second it ran: a replica whose own work got busier (a
                # multi-threaded OCR request on 2 cores) waits more because it runs more; a
                # starved one waits more for each second it gets.
                cpu_now, cpu_before = used[entity]
                per_cpu = (now_s / max(cpu_now, 1e-2)) / max(before_s / max(cpu_before, 1e-2),
                                                             1e-3)
                if per_cpu < t.ratio:
                    continue
                ratio = min(ratio, per_cpu)
            seen = served_requests(ctx, t.window_s, t.baseline_s).get(entity.replica or "")
            if seen is not None and (min(seen.now_n, seen.before_n) < t.min_requests
                                     or seen.now_med < t.slowdown * seen.before_med):
                continue
            score = ratio / t.ratio
            found.append(Finding(
                "ebpf_runq", entity, FaultClass.CPU, score, cur, ctx.now_ns,
                f"{entity} waited {per_s_now * 1e3:.0f} ms per second for a CPU "
                f"(was {per_s_before * 1e3:.0f} ms/s)",
                [entity.evidence(EvidenceKind.METRIC, RUNQ_LATENCY, FaultClass.CPU,
                                 "runq_wait_s_per_s", per_s_now, per_s_before, score)]))
        return found


@dataclass(frozen=True)
class CpuUseThresholds:
    window_s: float = 20.0
    baseline_s: float = 300.0
    min_history_s: float = 60.0
    ratio: float = 2.0  # serving nothing: CPU per second against its past...
    floor: float = 0.15  # ...and this much of a core more
    request_ratio: float = 3.0  # serving: CPU seconds per request against its past...
    request_floor_s: float = 0.04  # ...and this much more
    min_requests: int = 5  # now and before


class CpuUseDetector:
    """CPU use (its own work got heavier, contended or not), per request: ``request_ratio``
    times the CPU seconds per request it used to, and ``request_floor_s`` more, over at least
    ``min_requests`` requests now and before. That holds when a starved replica serves fewer
    requests (its CPU per second barely moves), and neither a traffic surge (more requests at
    the usual cost) nor a low-rate model's heavy requests arriving together trip it. A replica
    serving nothing in the window is judged per second: ``ratio`` times the CPU per second it
    used to, and ``floor`` of a core more."""

    name = "kernel_cpu"

    def __init__(self, thresholds: CpuUseThresholds | None = None) -> None:
        self.thresholds = thresholds or CpuUseThresholds()

    def findings(self, ctx: Round) -> list[Finding]:
        t = self.thresholds
        cur = ctx.now_ns - int(t.window_s * NS)
        cpu = replica_rates(ctx, CPU_TIME, t.window_s, t.baseline_s, t.min_history_s)
        served = served_requests(ctx, t.window_s, t.baseline_s) if cpu else {}
        found = []
        for entity, now_s, before_s, history_s in cpu:
            seen = served.get(entity.replica or "")
            n_now, n_before = (seen.now_n, seen.before_n) if seen else (0, 0)
            if n_now == 0:
                # Serving nothing, yet burning CPU: per second is all there is to judge by.
                per_s_now, per_s_before = now_s / t.window_s, before_s / history_s
                if per_s_now - per_s_before < t.floor or per_s_now < t.ratio * per_s_before:
                    continue
                score = per_s_now / max(per_s_before, 1e-3) / t.ratio
                found.append(Finding(
                    "cpu_use", entity, FaultClass.CPU, score, cur, ctx.now_ns,
                    f"{entity} used {per_s_now:.2f} CPU-seconds per second serving no "
                    f"requests (was {per_s_before:.2f})",
                    [entity.evidence(EvidenceKind.METRIC, CPU_TIME, FaultClass.CPU,
                                     "cpu_s_per_s", per_s_now, per_s_before, score)]))
                continue
            # Serving: judged per request, over enough of them. A few heavy requests of a
            # low-rate model (OCR) in one window are its usual work arriving together.
            if n_now < t.min_requests or n_before < t.min_requests:
                continue
            per_req_now, per_req_before = now_s / n_now, before_s / n_before
            if (per_req_now - per_req_before < t.request_floor_s
                    or per_req_now < t.request_ratio * per_req_before):
                continue
            score = per_req_now / max(per_req_before, 1e-4) / t.request_ratio
            found.append(Finding(
                "cpu_per_request", entity, FaultClass.CPU, score, cur, ctx.now_ns,
                f"{entity} used {per_req_now * 1e3:.0f} ms of CPU per request over {n_now} "
                f"requests (was {per_req_before * 1e3:.0f} ms)",
                [entity.evidence(EvidenceKind.METRIC, CPU_TIME, FaultClass.CPU,
                                 "cpu_s_per_request", per_req_now, per_req_before, score)]))
        return found

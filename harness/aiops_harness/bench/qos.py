"""Priority under load (``aiops bench qos``): does the ingress's admission control keep
latency-sensitive requests fast while batch requests flood the same model?

One fast model (the embedding model, one replica) is served twice on the same Ray instance:
through aiops' ingress (admission control, a queue per priority class, ``realtime`` first) and
as a plain Ray Serve deployment of the same backend (Serve's own FIFO, the same
``max_ongoing_requests``, replica count and CPU request). The paths run one after another,
never at once: they share the cores.

1. Capacity of each path: closed loop, ``2 * max_ongoing_requests`` clients, requests/s.
2. For each load level (a multiple of the larger capacity; 0 is realtime alone), open loop:
   realtime requests at a steady ``realtime_rps`` and batch requests at ``level * capacity``
   are sent at their scheduled times whatever is still outstanding. Latency counts from the
   scheduled time (no coordinated omission). Three configurations per level:
   ``aiops`` (realtime requests carry ``x-aiops-priority: realtime``), ``aiops, priority off``
   (the same requests, all labelled ``batch``: the control) and ``serve FIFO``.

Goals: realtime p99 <= 120 ms and <= 1.5x the unloaded p99 of the same
configuration; batch throughput >= 0.9x the FIFO's at the same level.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from aiops.client import ServerClient
from aiops.errors import AIOpsError
from aiops.semconv import PRIORITY_ATTR
from aiops_harness.bench.common import percentile, serve_bench
from aiops_harness.bench.cpu import Role, cores_used, snapshot
from serve.ingress import PRIORITY_HEADER
from serve.specs import DEFAULT_SPECS_FILE, ModelSpec, load_specs

__all__ = ["AIOPS", "AIOPS_OFF", "BATCH", "CONFIGS", "FIFO", "REALTIME", "ROLES", "Breakdown",
           "ClassStats", "LoadGenerator", "QosReport", "QosRow", "Sample", "class_headers",
           "http_client", "open_loop", "render", "run_qos", "schedule", "summarize"]

AIOPS = "aiops"
AIOPS_OFF = "aiops, priority off"
FIFO = "serve FIFO"
CONFIGS = (AIOPS, AIOPS_OFF, FIFO)
REALTIME, BATCH = "realtime", "batch"
P99_GOAL_MS = 120.0
P99_GROWTH_GOAL = 1.5
THROUGHPUT_GOAL = 0.9
TEXT = ("Ray Serve replicas answer embedding requests for a search index while nightly "
        "batch jobs re-embed the whole catalogue on the same two CPU cores.")


@dataclass(frozen=True)
class Sample:
    """One request: its class, HTTP status (0: no answer), latency from its scheduled send
    time, when it finished (seconds after the level started), and how late it was sent."""

    cls: str
    status: int
    latency_ms: float
    finished_s: float
    send_lag_ms: float = 0.0  # how late the client sent it (the load generator's own lag)


@dataclass(frozen=True)
class ClassStats:
    sent: int
    ok: int
    shed: int  # 429
    errors: int  # any other status, or no answer
    p50_ms: float
    p95_ms: float
    p99_ms: float
    throughput_rps: float  # 200s that finished inside the send window, per second
    send_lag_p99_ms: float = 0.0  # the client's lag behind the schedule (validity check)


@dataclass(frozen=True)
class Breakdown:
    """Where realtime requests spent their time on aiops' path, from the spans the stack
    exported to the aiops server: the ingress's SERVER span (admission wait included) and
    the model replica's span under it (p50 / p99, ms); the rest of what the client measured
    is Serve's HTTP proxy, the network and the client itself."""

    spans: int
    ingress_p50_ms: float
    ingress_p99_ms: float
    model_p50_ms: float
    model_p99_ms: float


@dataclass(frozen=True)
class QosRow:
    config: str
    level: float  # batch arrivals as a multiple of capacity
    batch_rps: float  # offered
    realtime: ClassStats
    batch: ClassStats
    drain_s: float = 0.0  # after the row, until one request answered in < 100 ms again
    breakdown: Breakdown | None = None  # aiops' path with priority on only
    cpu: dict[str, float] = field(default_factory=dict)  # cores used per role (ROLES)


@dataclass(frozen=True)
class QosReport:
    model: str
    max_ongoing_requests: int
    replicas: int
    max_queue: int
    duration_s: float
    realtime_rps: float
    capacity_rps: dict[str, float]
    rows: list[QosRow] = field(default_factory=list)
    high_throughput: bool = False  # Ray Serve's high-throughput mode (HAProxy; serve.throughput)
    metric: str = "latency"  # what the realtime percentiles are of ("TTFT": time to first token)
    p99_goal_ms: float | None = P99_GOAL_MS  # None: only the growth over unloaded is a goal

    def row(self, config: str, level: float) -> QosRow | None:
        return next((r for r in self.rows if r.config == config and r.level == level), None)

    def unloaded_p99_ms(self, config: str) -> float:
        row = self.row(config, 0.0)
        return row.realtime.p99_ms if row is not None else float("nan")


def schedule(rate: float, duration_s: float, offset_s: float = 0.0,
             seed: int | None = None) -> list[float]:
    """Send times (seconds after the start) of an open-loop stream: evenly spaced at
    ``rate``/s from ``offset_s``, or Poisson arrivals at that mean rate with ``seed``."""
    if rate <= 0 or duration_s <= 0:
        return []
    if seed is None:
        n = math.ceil(rate * duration_s)
        times = [offset_s + i / rate for i in range(n)]
    else:
        rng, times, t = random.Random(seed), [], offset_s
        while True:
            t += rng.expovariate(rate)
            if t >= offset_s + duration_s:
                break
            times.append(t)
    return [t for t in times if t < duration_s]


def summarize(samples: Sequence[Sample], cls: str, duration_s: float) -> ClassStats:
    """Per-class figures; latency percentiles over the requests answered 200."""
    mine = [s for s in samples if s.cls == cls]
    ok = [s for s in mine if s.status == 200]
    lat = [s.latency_ms for s in ok]
    nan = float("nan")
    in_window = sum(1 for s in ok if s.finished_s <= duration_s)
    return ClassStats(
        sent=len(mine), ok=len(ok), shed=sum(1 for s in mine if s.status == 429),
        errors=sum(1 for s in mine if s.status not in (200, 429)),
        p50_ms=percentile(lat, 50) if lat else nan, p95_ms=percentile(lat, 95) if lat else nan,
        p99_ms=percentile(lat, 99) if lat else nan,
        throughput_rps=in_window / duration_s if duration_s > 0 else nan,
        send_lag_p99_ms=percentile([s.send_lag_ms for s in mine], 99) if mine else nan)


# Who uses the cores while a row runs (by command line: Ray names a worker after its actor).
ROLES = (
    Role("load generator", lambda pid, c: pid == os.getpid() or "multiprocessing" in c),
    Role("Serve proxy", lambda _, c: "ProxyActor" in c),
    Role("HAProxy", lambda _, c: "haproxy" in c),
    Role("aiops ingress", lambda _, c: "ServeReplica:" in c and ":ingress" in c),
    Role("FIFO ingress", lambda _, c: "ServeReplica:" in c and "Fifo" in c and "Ingress" in c),
    Role("FIFO model", lambda _, c: "ServeReplica:" in c and "Fifo" in c),
    Role("aiops model", lambda _, c: "ServeReplica:" in c),
    Role("aiops server", lambda _, c: "aiops server" in c),
    Role("Ray", lambda _, c: "ray" in c.lower()),
)


# -- load ----------------------------------------------------------------------------------


def _target(url: str, config: str, model: str) -> tuple[str, dict[str, Any]]:
    path = "/fifo" if config == FIFO else "/v1/embeddings"
    return f"{url}{path}", {"model": model, "input": TEXT}


def class_headers(config: str, cls: str) -> dict[str, str]:
    if config == FIFO:
        return {}
    if config == AIOPS_OFF:
        return {PRIORITY_HEADER: BATCH}
    return {PRIORITY_HEADER: cls}


def http_client(timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
        max_connections=2000, max_keepalive_connections=2000))


async def open_loop(cls: str, times: list[float], timeout_s: float, start_wall: float,
                    request: Callable[[httpx.AsyncClient], Awaitable[tuple[int, float | None]]]
                    ) -> list[Sample]:
    """Send ``cls`` requests at ``times`` seconds after the wall-clock instant ``start_wall``,
    whatever is still outstanding. ``request(client)`` sends one and returns its status and
    the event-loop time its latency ends at (None: it never did)."""
    samples: list[Sample] = []
    async with http_client(timeout_s) as client:
        loop = asyncio.get_running_loop()
        start = loop.time() + (start_wall - time.time())

        async def one(at: float) -> None:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            lag = loop.time() - start - at
            status, mark = await request(client)
            end = loop.time()
            latency = (mark - start - at) * 1000 if mark is not None else float("nan")
            samples.append(Sample(cls, status, latency, end - start, lag * 1000))

        await asyncio.gather(*(one(t) for t in times))
    return samples


async def _open_loop(url: str, config: str, model: str, cls: str, times: list[float],
                     timeout_s: float, start_wall: float) -> list[Sample]:
    """Embedding requests; latency to the whole answer."""
    target, body = _target(url, config, model)

    async def post(client: httpx.AsyncClient) -> tuple[int, float | None]:
        try:
            status = (await client.post(target, json=body,
                                        headers=class_headers(config, cls))).status_code
        except httpx.HTTPError:
            status = 0
        return status, asyncio.get_running_loop().time()

    return await open_loop(cls, times, timeout_s, start_wall, post)


def _send(url: str, config: str, model: str, cls: str, times: list[float], timeout_s: float,
          start_wall: float) -> list[Sample]:
    """One class's stream, in a load-generator process of its own."""
    return asyncio.run(_open_loop(url, config, model, cls, times, timeout_s, start_wall))


def _ready() -> int:
    time.sleep(0.5)  # long enough that the pool hands the next call to the other process
    return os.getpid()


class LoadGenerator:
    """Two processes, one per class: the realtime stream is timed by an event loop that the
    batch flood (hundreds of requests a second of HTTP client work) does not also run on."""

    def __init__(self) -> None:
        import multiprocessing

        self._pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
        for f in [self._pool.submit(_ready) for _ in range(2)]:  # both started and imported
            f.result()

    def run(self, url: str, config: str, model: str, realtime: list[float],
            batch: list[float], timeout_s: float, send: Any = None) -> list[Sample]:
        """``send``: a module-level function with ``_send``'s signature (default ``_send``)."""
        start = time.time() + 0.5
        send = send or _send
        futures = [self._pool.submit(send, url, config, model, cls, times, timeout_s, start)
                   for cls, times in ((REALTIME, realtime), (BATCH, batch)) if times]
        return [s for f in futures for s in f.result()]

    def close(self) -> None:
        self._pool.shutdown()


async def _closed_loop(url: str, config: str, model: str, clients: int,
                       duration_s: float) -> float:
    target, body = _target(url, config, model)
    done = 0
    async with http_client(60.0) as client:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s

        async def worker() -> None:
            nonlocal done
            while loop.time() < end:
                try:
                    r = await client.post(target, json=body, headers=class_headers(config, BATCH))
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    done += 1

        started = loop.time()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return done / (loop.time() - started)


async def _settle(url: str, config: str, model: str, under_ms: float, limit_s: float) -> float:
    """Wait until one request on ``config``'s path answers within ``under_ms`` (a backlog left
    by the previous row would otherwise take CPU from the next); the seconds it took."""
    target, body = _target(url, config, model)
    async with http_client(limit_s) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < limit_s:
            t = loop.time()
            try:
                r = await client.post(target, json=body, headers=class_headers(config, BATCH))
                if r.status_code == 200 and (loop.time() - t) * 1000 < under_ms:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        return loop.time() - started


_BREAKDOWN_SQL = f"""
SELECT count(*) AS n,
       quantile_cont(i.duration_ns, 0.5) / 1e6, quantile_cont(i.duration_ns, 0.99) / 1e6,
       quantile_cont(m.duration_ns, 0.5) / 1e6, quantile_cont(m.duration_ns, 0.99) / 1e6
FROM spans i JOIN spans m ON m.trace_id = i.trace_id AND m.service_name = ?
WHERE i.service_name = 'ingress' AND i.kind = 'server'
  AND (i.attributes->>'{PRIORITY_ATTR}') = 'realtime'
  AND i.start_time >= make_timestamp_ns(?) AND i.start_time < make_timestamp_ns(?)"""


def _breakdown(client: ServerClient, model: str, start_ns: int, end_ns: int, expected: int,
               wait_s: float = 15.0) -> Breakdown | None:
    """The realtime requests' spans of one row, once (nearly) all of them were exported, or
    once their count has not grown for 3 s (exporters flush every second)."""
    deadline = time.monotonic() + wait_s
    row: list[Any] = []
    counts: list[int] = []
    while True:
        try:
            row = client.sql(_BREAKDOWN_SQL, [model, start_ns, end_ns])["rows"][0]
        except AIOpsError:
            row = []
        counts.append(int(row[0]) if row else 0)
        settled = len(counts) > 3 and counts[-1] > 0 and counts[-1] == counts[-4]
        if (row and row[0] >= 0.95 * expected) or settled or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if not row or not row[0]:
        return None
    return Breakdown(int(row[0]), *(float(v) for v in row[1:]))


def _spec(max_ongoing_requests: int | None = None,
          batch_max_in_flight: int | None = None) -> ModelSpec:
    """The shipped embedding spec, one replica (``max_replicas`` 1: the ingress's capacity is
    that replica's ``max_ongoing_requests``); ``batch_max_in_flight`` sets the spec's
    ``qos.batch_max_in_flight`` (aiops' path only: plain Serve has no classes)."""
    spec = next(s for s in load_specs(DEFAULT_SPECS_FILE) if s.backend == "onnx_embedding")
    update: dict[str, Any] = {"autoscaling": spec.autoscaling.model_copy(
        update={"min_replicas": 1, "max_replicas": 1})}
    if max_ongoing_requests is not None:
        update["max_ongoing_requests"] = max_ongoing_requests
    if batch_max_in_flight is not None:
        update["qos"] = spec.qos.model_copy(update={"batch_max_in_flight": batch_max_in_flight})
    return spec.model_copy(update=update)


def run_qos(levels: Sequence[float] = (0.0, 0.5, 1.0, 2.0), duration_s: float = 20.0,
            realtime_rps: float = 5.0, capacity_s: float = 5.0, timeout_s: float = 60.0,
            configs: Sequence[str] = CONFIGS, seed: int | None = None,
            max_ongoing_requests: int | None = None,
            batch_max_in_flight: int | None = None,
            high_throughput: bool = False) -> QosReport:
    """The whole benchmark (Ray and Serve started once); ``seed`` makes the arrivals Poisson
    (evenly spaced without it); ``max_ongoing_requests`` overrides the spec's on both paths
    (a diagnostic: how many batch requests a realtime one can find ahead of it);
    ``high_throughput`` runs both paths behind HAProxy (Ray Serve's high-throughput mode)."""
    from serve.app import deploy_config
    from serve.telemetry import TelemetryConfig

    spec = _spec(max_ongoing_requests, batch_max_in_flight)
    with serve_bench(high_throughput) as bench:
        url = bench.url
        config = deploy_config([spec], TelemetryConfig(bench.settings.server_url, 1.0), {})
        config["applications"].append({
            "name": "fifo", "route_prefix": "/fifo",
            "import_path": "aiops_harness.bench.peers:fifo_embedding_app",
            "args": {"spec": spec.model_dump(mode="json")}})
        bench.deploy(config)

        telemetry = ServerClient.of(bench.settings)
        paths = {c: (FIFO if c == FIFO else AIOPS) for c in configs}
        capacity: dict[str, float] = {}
        for path in dict.fromkeys(paths.values()):
            asyncio.run(_closed_loop(url, path, spec.name, 4, 2.0))  # warm-up
            capacity[path] = asyncio.run(_closed_loop(
                url, path, spec.name, 2 * spec.max_ongoing_requests, capacity_s))
        reference = max(capacity.values())

        rows: list[QosRow] = []
        with contextlib.closing(LoadGenerator()) as load:
            for level in levels:
                batch_rps = level * reference
                rt = schedule(realtime_rps, duration_s, 0.5 / realtime_rps, seed)
                bt = schedule(batch_rps, duration_s, 0.0, None if seed is None else seed + 1)
                for config_name in configs:
                    started_ns, cpu_before = time.time_ns(), snapshot(ROLES)
                    samples = load.run(url, config_name, spec.name, rt, bt, timeout_s)
                    ended_ns, cpu = time.time_ns(), cores_used(cpu_before, snapshot(ROLES))
                    drain = asyncio.run(_settle(url, config_name, spec.name, 100.0,
                                                3 * timeout_s))
                    realtime = summarize(samples, REALTIME, duration_s)
                    spans = _breakdown(telemetry, spec.name, started_ns, ended_ns, realtime.ok) \
                        if config_name == AIOPS else None
                    rows.append(QosRow(config_name, level, batch_rps, realtime,
                                       summarize(samples, BATCH, duration_s), drain, spans,
                                       dict(cpu)))
    return QosReport(model=spec.name, max_ongoing_requests=spec.max_ongoing_requests,
                     replicas=spec.autoscaling.max_replicas, max_queue=spec.qos.max_queue,
                     duration_s=duration_s, realtime_rps=realtime_rps,
                     capacity_rps=capacity, rows=rows, high_throughput=high_throughput)


# -- report --------------------------------------------------------------------------------


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:,.0f}"


def _verdict(report: QosReport, row: QosRow) -> str:
    """Goal check of one row: realtime p99 vs 120 ms and vs 1.5x unloaded; batch vs FIFO."""
    p99, unloaded = row.realtime.p99_ms, report.unloaded_p99_ms(row.config)
    parts = []
    goal = report.p99_goal_ms
    if p99 != p99:
        parts.append("no realtime answered")
    else:
        if goal is not None:
            parts.append("p99 ok" if p99 <= goal else f"p99 > {goal:g}")
        if row.level > 0 and unloaded == unloaded:
            parts.append(f"{p99 / unloaded:.1f}x unloaded")
    fifo = report.row(FIFO, row.level)
    if row.config != FIFO and row.level > 0 and fifo is not None \
            and fifo.batch.throughput_rps > 0:
        parts.append(f"batch {row.batch.throughput_rps / fifo.batch.throughput_rps:.2f}x FIFO")
    return ", ".join(parts)


def render(report: QosReport) -> str:
    """The report as a markdown table, one row per (level, configuration)."""
    cap = ", ".join(f"{k} {v:,.1f} req/s" for k, v in report.capacity_rps.items())
    lines = [
        f"model {report.model}: {report.replicas} replica(s), max_ongoing_requests "
        f"{report.max_ongoing_requests}, max_queue {report.max_queue} per class; "
        f"capacity (closed loop): {cap}; realtime {report.realtime_rps:g} req/s; "
        f"{report.duration_s:g} s per row; HTTP in front: "
        + ("HAProxy (Ray Serve's high-throughput mode)" if report.high_throughput
           else "Serve's Python proxy (Ray Serve's default)"),
        "",
        f"| level | batch offered (req/s) | config | realtime {report.metric} p50 / p95 / p99 "
        f"(ms) | realtime 429 / err | batch {report.metric} p50 / p99 (ms) | batch done (req/s) "
        "| batch 429 / err | goals | client lag p99 (ms) | drain (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        rt, b = r.realtime, r.batch
        lines.append(
            f"| {r.level:g}x | {r.batch_rps:,.1f} | {r.config} | "
            f"{_ms(rt.p50_ms)} / {_ms(rt.p95_ms)} / {_ms(rt.p99_ms)} | "
            f"{rt.shed} / {rt.errors} of {rt.sent} | "
            f"{_ms(b.p50_ms)} / {_ms(b.p99_ms)} | {b.throughput_rps:,.1f} | "
            f"{b.shed} / {b.errors} of {b.sent} | {_verdict(report, r)} | "
            f"{_ms(max(rt.send_lag_p99_ms, b.send_lag_p99_ms if b.sent else 0.0))} | "
            f"{r.drain_s:,.0f} |")
    split = [r for r in report.rows if r.breakdown is not None]
    if split:
        lines += [
            "", f"Where realtime requests spent their time ({AIOPS}, from the exported spans; "
            "p50 / p99 ms; outside = client minus ingress, p50: Serve's proxy, the network "
            "and the client):", "",
            "| level | realtime spans | client | ingress span | model span | outside (p50) |",
            "|---|---|---|---|---|---|"]
        for r in split:
            s = r.breakdown
            assert s is not None
            lines.append(
                f"| {r.level:g}x | {s.spans} | {_ms(r.realtime.p50_ms)} / "
                f"{_ms(r.realtime.p99_ms)} | {_ms(s.ingress_p50_ms)} / {_ms(s.ingress_p99_ms)} "
                f"| {_ms(s.model_p50_ms)} / {_ms(s.model_p99_ms)} | "
                f"{_ms(r.realtime.p50_ms - s.ingress_p50_ms)} |")
    return "\n".join(lines + _render_cpu(report))


def _render_cpu(report: QosReport) -> list[str]:
    roles = [r.name for r in ROLES] + ["other"]
    seen = [n for n in roles if any(row.cpu.get(n, 0.0) >= 0.005 for row in report.rows)]
    if not seen:
        return []
    lines = ["", f"Cores used while each row ran (CPU seconds per second, of "
             f"{os.cpu_count()}; the load generator shares them):", "",
             "| level | config | " + " | ".join(seen) + " | total |",
             "|---|---|" + "---|" * (len(seen) + 1)]
    for r in report.rows:
        lines.append(f"| {r.level:g}x | {r.config} | "
                     + " | ".join(f"{r.cpu.get(n, 0.0):.2f}" for n in seen)
                     + f" | {sum(r.cpu.values()):.2f} |")
    return lines

"""``aiops bench volume``: a whole cluster's telemetry, live, into one aiops server.

A cluster of N nodes x R replicas x Q requests per second per replica, each request three
spans (the ingress SERVER span, the replica's span, a backend span) and two log records, sent
as the Serve app's exporters send them: per node, one OTLP trace request and one log request a
second. The server runs on one core with its analytics on (the live detectors read what
arrives); this process sends from the others. The requests are encoded before the run, with
the timestamps of the second they are sent in, so the client's encoding is not what limits.

Reported: rows per second offered and stored, requests refused (429/503, retryable) or
failed, how far behind the sender fell, the server's CPU (share of its core) and peak RSS,
its analytics rounds (last and longest, from its /metrics) and the Serving dashboard's
latency panel timed through /api/v1/sql while the load runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from aiops_harness.bench.common import peak_rss_mib, percentile, running_server

__all__ = ["VolumeConfig", "VolumeResult", "encode_second", "run_volume"]

NS = 1_000_000_000
MODELS = ("chat-a", "chat-b", "embed", "ocr")


@dataclass(frozen=True)
class VolumeConfig:
    nodes: int = 100
    replicas_per_node: int = 8
    requests_per_s: float = 2.0  # per replica
    seconds: int = 60
    clients: int = 8
    seed: int = 7

    @property
    def requests_per_node_s(self) -> int:
        return max(1, round(self.replicas_per_node * self.requests_per_s))

    @property
    def rows_per_s(self) -> int:
        return self.nodes * self.requests_per_node_s * 5  # 3 spans + 2 log records


@dataclass
class VolumeResult:
    config: VolumeConfig
    sent_rows: int
    stored_rows: int
    elapsed_s: float
    refused: int
    failed: int
    max_lag_s: float
    server_cpu_share: float
    server_peak_rss_mib: float
    analytics_rounds: int
    analytics_last_s: float
    analytics_max_s: float
    panel_ms: list[float] = field(default_factory=list)
    panel_failed: int = 0

    @property
    def stored_per_s(self) -> float:
        return self.stored_rows / self.elapsed_s


def _kv(key: str, value: str | int) -> KeyValue:
    v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def encode_second(cfg: VolumeConfig, node: int, t0_ns: int) -> tuple[bytes, bytes]:
    """One node's second of telemetry starting at ``t0_ns``: its trace and log requests."""
    by_service: dict[str, list[Span]] = {"ingress": []}
    records: dict[str, list[LogRecord]] = {}
    n = cfg.requests_per_node_s
    for i in range(n):
        replica = i % cfg.replicas_per_node
        model = MODELS[replica % len(MODELS)]
        start = t0_ns + i * (NS // n)
        trace_id = secrets.token_bytes(16)
        root, child, leaf = (secrets.token_bytes(8) for _ in range(3))
        common = [_kv("gen_ai.request.model", model), _kv("aiops.model.version", "v1")]
        by_service["ingress"].append(Span(
            trace_id=trace_id, span_id=root, name="POST /v1/chat/completions",
            kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start,
            end_time_unix_nano=start + 210_000_000, status=Status(code=Status.STATUS_CODE_OK),
            attributes=[*common, _kv("http.response.status_code", 200)]))
        by_service.setdefault(model, []).extend([
            Span(trace_id=trace_id, span_id=child, parent_span_id=root, name=f"chat {model}",
                 kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start + 2_000_000,
                 end_time_unix_nano=start + 205_000_000,
                 attributes=[*common, _kv("ray.serve.replica", f"n{node}-r{replica}"),
                             _kv("gen_ai.usage.output_tokens", 8)]),
            Span(trace_id=trace_id, span_id=leaf, parent_span_id=child, name="backend generate",
                 kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start + 3_000_000,
                 end_time_unix_nano=start + 200_000_000, attributes=common)])
        records.setdefault(model, []).extend(LogRecord(
            time_unix_nano=start + k, observed_time_unix_nano=start + k,
            severity_number=9,  # type: ignore[arg-type]  # INFO; the stub wants the enum
            severity_text="INFO", trace_id=trace_id, span_id=child,
            body=AnyValue(string_value=f"chat completion in 0.2{k} s: 42 input tokens, "
                                       "8 output tokens, stop"),
            attributes=common) for k in range(2))
    host = _kv("host.name", f"node-{node}")
    traces = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=[_kv("service.name", svc), host]),
        scope_spans=[ScopeSpans(spans=spans)]) for svc, spans in by_service.items()])
    logs = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=[_kv("service.name", svc), host]),
        scope_logs=[ScopeLogs(log_records=recs)]) for svc, recs in records.items()])
    return traces.SerializeToString(), logs.SerializeToString()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _panel_sql() -> str:
    from dashboards.infinity import TIME_PARAMS
    from dashboards.serving import latency_percentiles

    body = latency_percentiles(model_filter=False).fields()["url_options"]["data"]
    for param in TIME_PARAMS:
        body = body.replace(param, "0")
    return str(json.loads(body)["sql"])


def run_volume(workdir: Path, cfg: VolumeConfig,
               progress: Callable[[str], None] = lambda _: None) -> VolumeResult:
    workdir.mkdir(parents=True, exist_ok=True)
    previous = os.sched_getaffinity(0)
    others = previous - {0} or previous
    os.sched_setaffinity(0, others)
    try:
        with running_server(workdir, cpu=0, ingest_memory_mb=512) as (settings, pid):
            progress(f"encoding {cfg.seconds} s of {cfg.nodes} nodes' telemetry "
                     f"({cfg.rows_per_s:,} rows/s)")
            t = time.perf_counter()
            encode_second(cfg, 0, time.time_ns())
            per_second = (time.perf_counter() - t) * cfg.nodes
            # The timestamps are those of the second each request is sent in.
            start_ns = time.time_ns() + int((per_second * cfg.seconds * 1.5 + 2) * NS)
            seconds = [[encode_second(cfg, node, start_ns + s * NS)
                        for node in range(cfg.nodes)] for s in range(cfg.seconds)]
            return _replay(settings.server_url, pid, cfg, seconds, start_ns, progress)
    finally:
        os.sched_setaffinity(0, previous)


def _replay(url: str, pid: int, cfg: VolumeConfig, seconds: list[list[tuple[bytes, bytes]]],
            start_ns: int, progress: Callable[[str], None]) -> VolumeResult:
    jobs: list[tuple[str, bytes]] = []
    lock, stop = threading.Condition(), threading.Event()
    counts = {"refused": 0, "failed": 0, "panel_failed": 0}
    panel, panel_ms = _panel_sql(), []

    def sender() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while True:
                with lock:
                    while not jobs and not stop.is_set():
                        lock.wait(0.1)
                    if not jobs:
                        return
                    signal, body = jobs.pop(0)
                try:
                    r = c.post(f"/v1/{signal}", content=body,
                               headers={"content-type": "application/x-protobuf"})
                    key = None if r.status_code == 200 else \
                        "refused" if r.status_code in (429, 503) else "failed"
                except httpx.HTTPError:
                    key = "failed"
                if key:
                    with lock:
                        counts[key] += 1

    def dashboard() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.wait(2.0):
                now_ms = time.time_ns() // 1_000_000
                t = time.perf_counter()
                r = c.post("/api/v1/sql", json={"sql": panel,
                                                "params": [now_ms - 3_600_000, now_ms]})
                if r.status_code == 200:
                    panel_ms.append((time.perf_counter() - t) * 1e3)
                else:
                    counts["panel_failed"] += 1

    while time.time_ns() < start_ns:
        time.sleep(0.01)
    progress(f"sending for {cfg.seconds} s")
    threads = [threading.Thread(target=sender) for _ in range(cfg.clients)]
    threads.append(threading.Thread(target=dashboard))
    cpu0, wall0 = _cpu_s(pid), time.perf_counter()
    for th in threads:
        th.start()
    max_lag = 0.0
    for s, bodies in enumerate(seconds):
        due = start_ns + s * NS
        while time.time_ns() < due:
            time.sleep(0.002)
        with lock:
            max_lag = max(max_lag, len(jobs) / (2 * cfg.nodes))  # seconds of work queued
            for traces, logs in bodies:
                jobs.append(("traces", traces))
                jobs.append(("logs", logs))
            lock.notify_all()
    stop.set()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - wall0
    cpu = (_cpu_s(pid) - cpu0) / elapsed
    with httpx.Client(base_url=url, timeout=60) as c:
        metrics = c.get("/metrics").text
        stored = sum(int(c.post("/api/v1/sql", json={"sql": f"SELECT count(*) AS n FROM {t}"}
                                ).json()["rows"][0][0]) for t in ("spans", "logs"))
    sent = cfg.rows_per_s * cfg.seconds
    return VolumeResult(cfg, sent, stored, elapsed, counts["refused"], counts["failed"],
                        max_lag, cpu, peak_rss_mib(pid),
                        int(_gauge(metrics, "aiops_analytics_rounds")),
                        _gauge(metrics, "aiops_analytics_round_seconds"),
                        _gauge(metrics, "aiops_analytics_round_max_seconds"), panel_ms,
                        counts["panel_failed"])


def summary(r: VolumeResult) -> dict[str, str]:
    c = r.config
    return {
        "cluster": f"{c.nodes} nodes x {c.replicas_per_node} replicas x "
                   f"{c.requests_per_s:g} req/s ({c.nodes * c.requests_per_node_s:,} req/s)",
        "rows offered / stored per s": f"{c.rows_per_s:,} / {r.stored_per_s:,.0f}",
        "rows stored of sent": f"{r.stored_rows:,} of {r.sent_rows:,}",
        "requests refused (retryable) / failed": f"{r.refused} / {r.failed}",
        "sender's backlog, most": f"{r.max_lag_s:.1f} s",
        "server CPU (share of its core)": f"{r.server_cpu_share:.0%}",
        "server peak RSS": f"{r.server_peak_rss_mib:,.0f} MiB",
        "analytics rounds; last / longest": f"{r.analytics_rounds}; {r.analytics_last_s:.3f} / "
                                            f"{r.analytics_max_s:.3f} s",
        "dashboard latency panel p50 / p95 (under load)":
            f"{percentile(r.panel_ms, 50):.0f} / {percentile(r.panel_ms, 95):.0f} ms "
            f"({len(r.panel_ms)} runs, {r.panel_failed} failed)" if r.panel_ms else
            f"- ({r.panel_failed} failed)",
    }

"""Benchmarks (``aiops bench``, ``make bench``). Figures go to docs/benchmarks.md by hand, with
the command that produced them; nothing here asserts a speed.

``ingest``: OTLP protobuf spans and logs end to end into DuckDB through a real ``aiops server``
subprocess, over HTTP and over gRPC (the very same requests), from pre-encoded requests
replayed by client threads (so the client is not what is measured), and beside it the store's
own Arrow append rate and the row-by-row ``executemany`` insert it replaces.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from aiops.schema import SPANS
from aiops.store import Store
from aiops_harness.bench.common import free_port, peak_rss_mib, running_server
from collectors.otlp.decode import decode

__all__ = ["IngestResult", "encoded_trace_requests", "run_ingest"]


def _kv(key: str, value: str | int) -> KeyValue:
    v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def encoded_trace_requests(n_requests: int, spans_per_request: int) -> list[bytes]:
    """Distinct OTLP protobuf trace requests shaped like the Serve app's spans."""
    bodies = []
    t0 = time.time_ns()
    for _ in range(n_requests):
        spans = []
        for i in range(spans_per_request):
            start = t0 + i * 1000
            spans.append(Span(
                trace_id=secrets.token_bytes(16), span_id=secrets.token_bytes(8),
                parent_span_id=secrets.token_bytes(8), name="chat smollm2-135m-instruct",
                kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start,
                end_time_unix_nano=start + 250_000_000,
                attributes=[_kv("gen_ai.request.model", "smollm2-135m-instruct"),
                            _kv("gen_ai.usage.input_tokens", 42),
                            _kv("gen_ai.usage.output_tokens", 17),
                            _kv("inference_id", secrets.token_hex(16))]))
        req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
            resource=Resource(attributes=[_kv("service.name", "smollm2-135m-instruct"),
                                          _kv("service.version", "v1")]),
            scope_spans=[ScopeSpans(spans=spans)])])
        bodies.append(req.SerializeToString())
    return bodies


def encoded_log_requests(n_requests: int, records_per_request: int) -> list[bytes]:
    """Distinct OTLP protobuf log requests shaped like the Serve app's log records."""
    bodies = []
    t0 = time.time_ns()
    for _ in range(n_requests):
        records = [LogRecord(
            time_unix_nano=t0 + i, observed_time_unix_nano=t0 + i,
            severity_number=9,  # type: ignore[arg-type]  # INFO; the stub wants the enum
            severity_text="INFO", trace_id=secrets.token_bytes(16),
            span_id=secrets.token_bytes(8),
            body=AnyValue(string_value="chat completion in 0.412 s: 42 input tokens, "
                                       "17 output tokens, stop"),
            attributes=[_kv("inference_id", secrets.token_hex(16)),
                        _kv("gen_ai.request.model", "smollm2-135m-instruct"),
                        _kv("aiops.model.version", "v1")])
            for i in range(records_per_request)]
        req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
            resource=Resource(attributes=[_kv("service.name", "smollm2-135m-instruct")]),
            scope_logs=[ScopeLogs(log_records=records)])])
        bodies.append(req.SerializeToString())
    return bodies


@dataclass(frozen=True)
class IngestResult:
    spans: int
    http_spans_per_s: float
    logs: int
    http_logs_per_s: float
    grpc_spans_per_s: float
    grpc_logs_per_s: float
    server_peak_rss_mib: float
    pinned: bool
    arrow_append_rows_per_s: float
    executemany_rows_per_s: float


def _ingest(
    bodies: dict[str, list[bytes]], rounds: int, clients: int, workdir: Path
) -> tuple[dict[tuple[str, str], float], float]:
    """Seconds per (transport, signal) to replay the bodies over OTLP/HTTP and OTLP/gRPC (the
    same requests), and the server's peak RSS. The server runs on core 0 and this client on
    the others, so the figure is the server's on one core."""
    elapsed = {}
    previous = os.sched_getaffinity(0)
    others = previous - {0} or previous
    os.sched_setaffinity(0, others)
    try:
        with running_server(workdir, cpu=0, otlp_grpc_port=free_port()) as (settings, pid):
            target = f"127.0.0.1:{settings.otlp_grpc_port}"
            for signal, signal_bodies in bodies.items():
                elapsed["http", signal] = _replay(settings.server_url, signal, signal_bodies,
                                                  rounds, clients)
                elapsed["grpc", signal] = _replay_grpc(target, signal, signal_bodies, rounds,
                                                       clients)
            return elapsed, peak_rss_mib(pid)
    finally:
        os.sched_setaffinity(0, previous)


def _drive(bodies: list[bytes], rounds: int, clients: int,
           client: Callable[[], AbstractContextManager[Callable[[bytes], str | None]]]
           ) -> float:
    """Seconds for ``clients`` threads to send every body ``rounds`` times, each through its
    own ``client()`` (a context giving a send that returns an error text, or None)."""
    jobs = [b for _ in range(rounds) for b in bodies]
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        with client() as send:
            while True:
                with lock:
                    if not jobs:
                        return
                    body = jobs.pop()
                error = send(body)
                if error is not None:
                    errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} exports failed, e.g. {errors[0]}")
    return elapsed


def _replay(url: str, signal: str, bodies: list[bytes], rounds: int, clients: int) -> float:
    @contextmanager
    def client() -> Iterator[Callable[[bytes], str | None]]:
        with httpx.Client(base_url=url, timeout=60) as c:
            def send(body: bytes) -> str | None:
                r = c.post(f"/v1/{signal}", content=body,
                           headers={"content-type": "application/x-protobuf"})
                return None if r.status_code == 200 else r.text

            yield send

    return _drive(bodies, rounds, clients, client)


def _replay_grpc(target: str, signal: str, bodies: list[bytes], rounds: int,
                 clients: int) -> float:
    """As ``_replay``, through the gRPC Export method (one channel per client thread)."""
    import grpc

    from collectors.otlp.grpc_receiver import SERVICES

    @contextmanager
    def client() -> Iterator[Callable[[bytes], str | None]]:
        with grpc.insecure_channel(target, options=[
                ("grpc.max_send_message_length", 64 << 20)]) as channel:
            export = channel.unary_unary(f"/{SERVICES[signal]}/Export")

            def send(body: bytes) -> str | None:
                try:
                    export(body, timeout=60)
                except grpc.RpcError as exc:
                    return f"{exc.code()}: {exc.details()}"
                return None

            yield send

    return _drive(bodies, rounds, clients, client)


def _store_rates(bodies: list[bytes], workdir: Path) -> tuple[float, float]:
    tables = [decode("traces", b, "protobuf")["spans"] for b in bodies]
    rows = sum(t.num_rows for t in tables)
    store = Store(workdir / "arrow.duckdb")
    started = time.perf_counter()
    for t in tables:
        store.append("spans", t)
    arrow_rate = rows / (time.perf_counter() - started)
    store.close()
    # The peer: the same rows through DB-API executemany, one small table's worth.
    conn = duckdb.connect(str(workdir / "rows.duckdb"))
    conn.execute(SPANS.ddl())
    # datetime has microseconds; the peer gets the timestamps at that precision.
    first = tables[0]
    for i, field in enumerate(first.schema):
        if pa.types.is_timestamp(field.type):
            first = first.set_column(i, field.name, first.column(i).cast(pa.timestamp("us"),
                                                                          safe=False))
    sample = first.to_pylist()
    wire = SPANS.wire.column_names  # what a decoded batch holds (no server-set columns)
    placeholders = ", ".join("?" for _ in wire)
    started = time.perf_counter()
    conn.executemany(f"INSERT INTO spans ({', '.join(wire)}) VALUES ({placeholders})",
                     [[r[c] for c in wire] for r in sample])
    row_rate = len(sample) / (time.perf_counter() - started)
    conn.close()
    return arrow_rate, row_rate


def run_ingest(requests: int = 20, spans_per_request: int = 1000, rounds: int = 5,
               clients: int = 4) -> IngestResult:
    spans = encoded_trace_requests(requests, spans_per_request)
    logs = encoded_log_requests(requests, spans_per_request)
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp:
        work = Path(tmp)
        elapsed, rss = _ingest({"traces": spans, "logs": logs}, rounds, clients, work)
        arrow_rate, row_rate = _store_rates(spans, work)
    total = requests * spans_per_request * rounds
    return IngestResult(total, total / elapsed["http", "traces"], total,
                        total / elapsed["http", "logs"], total / elapsed["grpc", "traces"],
                        total / elapsed["grpc", "logs"], rss, (os.cpu_count() or 1) > 1,
                        arrow_rate, row_rate)

"""The attacks of the door-policy audit (P27), rerun against a real ``aiops server`` process on
loopback with its default settings except where said: what each costs the server (its RSS, its
answers) and whether bystanders keep exporting.

* ``grpc_stall``: unauthenticated OTLP/gRPC streams that declare a 16 MiB message and keep
  sending, 8 connections x 32 streams (the audit: RSS 506 -> 3,842 MB, then a database
  DuckDB invalidated).
* ``remote_write_bomb``: one Prometheus remote-write body of 0.72 MiB that is 8M empty
  samples (the audit: 30 CPU-s and 5.6 GB alone; four at once aborted the process), alone and
  four at once, with an exporter beside them.
* ``connection_flood``: 17 addresses each opening 500 idle connections, alternately to the HTTP
  and the gRPC port (the audit: 18,022 connections to gRPC filled the descriptor limit in 15 s
  and HTTP, SQL and gRPC all failed; 17 x 250 idle HTTP connections passed the global cap), with
  an HTTP and a gRPC exporter beside them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cramjam
import httpx

from aiops_harness.bench.common import free_port, running_server

__all__ = ["AttackResult", "connection_flood", "grpc_stall", "remote_write_bomb"]

MiB = 2**20


@dataclass
class AttackResult:
    name: str
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    answers: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    bystander: str = ""
    ready_after: int = 0


def _rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Peak:
    """The process' RSS sampled every 50 ms while an attack runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            time.sleep(0.05)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _bystander(url: str, token: str | None = None) -> int:
    """A small OTLP/HTTP export of one span, as any exporter would send."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    now = time.time_ns()
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
        spans=[Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="bystander",
                    start_time_unix_nano=now - 1000, end_time_unix_nano=now)])])])
    auth = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/v1/traces", content=body.SerializeToString(), timeout=30,
                      headers={"content-type": "application/x-protobuf", **auth}).status_code


def grpc_stall(connections: int = 8, streams: int = 32, seconds: float = 10.0,
               declared: int = 16 * MiB, admitted: bool = False) -> AttackResult:
    """``admitted``: the default config, where a loopback caller is anonymous with the ingest
    role (the streams are admitted and reserve before reading); else tokens are required and
    the streams carry none."""
    from aiops.auth import TOKENS_FILE, TokenStore

    who = "anonymous, admitted (default config)" if admitted else "unauthenticated"
    out = AttackResult(f"gRPC: {connections} x {streams} {who} streams declaring "
                       f"{declared // MiB} MiB, sending for {seconds:g} s")
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp:
        token = TokenStore(Path(tmp) / "server" / TOKENS_FILE).add("bystander", None)
        with running_server(Path(tmp), otlp_grpc_port=free_port(),
                            anonymous_on_loopback=admitted) as (s, pid):
            _stall(out, s, pid, connections, streams, seconds, declared, token)
    return out


def _stall(out: AttackResult, s: Any, pid: int, connections: int, streams: int,
           seconds: float, declared: int, token: str) -> None:
    import h2.config
    import h2.connection
    import h2.events

    out.rss_before_mb = _rss_mb(pid)
    conns = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", s.otlp_grpc_port))
        sock.settimeout(0.01)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        ids = []
        for _ in range(streams):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [
                (":method", "POST"), (":scheme", "http"), (":authority", "aiops"),
                (":path", "/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
                ("content-type", "application/grpc"), ("te", "trailers")])
            ids.append(sid)
        sock.sendall(conn.data_to_send())
        conns.append((sock, conn, ids))
    chunk = b"\x00" + declared.to_bytes(4, "big") + b"\x00" * MiB
    sent, answered = 0, set()
    with _Peak(pid) as peak:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for sock, conn, ids in conns:
                for sid in ids:
                    if (sock, sid) in answered:
                        continue
                    try:
                        n = min(len(chunk), conn.local_flow_control_window(sid),
                                conn.max_outbound_frame_size)
                        if n > 0:
                            conn.send_data(sid, chunk[:n])
                            sent += n
                    except Exception:  # noqa: BLE001 - a stream the server ended
                        answered.add((sock, sid))
                try:
                    for ev in conn.receive_data(sock.recv(1 << 16)):
                        if isinstance(ev, h2.events.TrailersReceived | h2.events.StreamReset):
                            answered.add((sock, ev.stream_id))
                except (TimeoutError, OSError):
                    pass
                try:
                    if data := conn.data_to_send():
                        sock.sendall(data)
                except OSError:
                    pass
        out.bystander = str(_bystander(s.server_url, token))
    out.rss_peak_mb = peak.peak
    for sock, _, _ in conns:
        sock.close()
    time.sleep(2)
    out.rss_after_mb = _rss_mb(pid)
    out.answers = {"streams answered": len(answered)}
    out.notes.append(f"bytes the server let the streams send: {sent / MiB:.2f} MiB")
    out.ready_after = httpx.get(f"{s.server_url}/readyz", timeout=10).status_code


def remote_write_bomb(samples: int = 8_000_000, parallel: int = 4) -> AttackResult:
    from collectors.remote_write import WriteRequest

    req = WriteRequest()
    for i in range(4):
        series = req.timeseries.add()
        series.labels.add(name="__name__", value=f"bomb_{i}")
        for _ in range(samples // 4):
            series.samples.add()
    raw = req.SerializeToString()
    body = bytes(cramjam.snappy.compress_raw(raw))
    out = AttackResult(f"remote write: {len(body) / MiB:.2f} MiB body = {samples:,} empty "
                       f"samples ({len(raw) / MiB:.1f} MiB decompressed), alone then "
                       f"{parallel} at once")
    headers = {"content-type": "application/x-protobuf", "content-encoding": "snappy"}
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp, running_server(
            Path(tmp)) as (s, pid):
        out.rss_before_mb = _rss_mb(pid)
        answers: list[int] = []

        def send() -> None:
            answers.append(httpx.post(f"{s.server_url}/api/v1/write", content=body,
                                      headers=headers, timeout=300).status_code)

        with _Peak(pid) as peak:
            started = time.monotonic()
            send()
            out.notes.append(f"alone: HTTP {answers[-1]} in {time.monotonic() - started:.1f} s")
            threads = [threading.Thread(target=send) for _ in range(parallel)]
            for t in threads:
                t.start()
            out.bystander = str(_bystander(s.server_url))
            for t in threads:
                t.join()
        out.rss_peak_mb = peak.peak
        out.rss_after_mb = _rss_mb(pid)
        for code in answers:
            out.answers[str(code)] = out.answers.get(str(code), 0) + 1
        out.ready_after = httpx.get(f"{s.server_url}/readyz", timeout=10).status_code
    return out


def _grpc_bystander(target: str) -> str:
    """A one-span OTLP/gRPC export, as an SDK's exporter sends it: its status code's name."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    from collectors.otlp.grpc_receiver import SERVICES

    now = time.time_ns()
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
        spans=[Span(trace_id=b"\x03" * 16, span_id=b"\x04" * 8, name="bystander",
                    start_time_unix_nano=now - 1000, end_time_unix_nano=now)])])])
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]
                               ) as channel:
        export = channel.unary_unary(f"/{SERVICES['traces']}/Export")
        try:
            export(body.SerializeToString(), timeout=30)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed (or refused) this connection: what it sent is drained,
    then an end of stream or a reset says so."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def connection_flood(addresses: int = 17, per_address: int = 500) -> AttackResult:
    out = AttackResult(f"connections: {addresses} addresses x {per_address} idle connections, "
                       f"alternately to the HTTP and the gRPC port (defaults: 4,096 in all, "
                       f"256 per address)")
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp, running_server(
            Path(tmp), otlp_grpc_port=free_port()) as (s, pid):
        out.rss_before_mb = _rss_mb(pid)
        fds_before = len(os.listdir(f"/proc/{pid}/fd"))
        held: list[socket.socket] = []
        failed = 0
        with _Peak(pid) as peak:
            started = time.monotonic()
            for a in range(addresses):
                source = f"127.0.0.{10 + a}"
                for i in range(per_address):
                    port = s.server_port if i % 2 == 0 else s.otlp_grpc_port
                    try:
                        held.append(socket.create_connection(
                            ("127.0.0.1", port), timeout=5, source_address=(source, 0)))
                    except OSError:
                        failed += 1
            opened_s = time.monotonic() - started
            time.sleep(2)
            fds_held = len(os.listdir(f"/proc/{pid}/fd"))
            closed = sum(_closed_by_server(sock) for sock in held)
            out.bystander = (f"HTTP {_bystander(s.server_url)}, gRPC "
                             f"{_grpc_bystander(f'127.0.0.1:{s.otlp_grpc_port}')}")
            out.ready_after = httpx.get(f"{s.server_url}/readyz", timeout=30).status_code
            out.answers = {"connections opened": len(held), "failed to connect": failed,
                           "closed or refused by the server": closed,
                           "held open": len(held) - closed}
            out.notes.append(f"opened in {opened_s:.1f} s; server descriptors {fds_before} "
                             f"before, {fds_held} while held")
            for sock in held:
                sock.close()
        out.rss_peak_mb = peak.peak
        time.sleep(1)
        out.rss_after_mb = _rss_mb(pid)
    return out

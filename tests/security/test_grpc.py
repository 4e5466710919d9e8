"""The OTLP/gRPC receiver holds up as OTLP/HTTP does: callers are checked from the call's
metadata (no token, an unknown one, one without the ingest role), malformed and oversized
messages (gzip bombs included) are refused without retry, full buffers say UNAVAILABLE with
RetryInfo, out-of-range times are per-record partial successes, provenance needs the serving
stack's credential, and a connection that never speaks is closed."""

from __future__ import annotations

import gzip
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from fastapi import FastAPI
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from prometheus_client import CollectorRegistry

from aiops.auth import TOKENS_FILE, Authenticator, Role, TokenStore, stack_credential
from aiops.config import load_settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from collectors.otlp.export import ReceiverMetrics
from collectors.otlp.grpc_receiver import SERVICES, GrpcOptions, GrpcReceiver
from collectors.otlp.writer import BatchWriter, MemoryBudget
from tests.loopback import serving
from tests.security.test_ingest import NOW, TOP, WRAPS, logs, provenance_record, span, traces

MAX_MESSAGE = 64 * 1024


@dataclass
class Grpc:
    target: str
    store: Store
    app: FastAPI
    tokens: dict[str, str]

    def call(self, signal: str, body: bytes, token: str | None = None,
             compression: grpc.Compression | None = None) -> bytes:
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        with grpc.insecure_channel(self.target) as channel:
            export = channel.unary_unary(f"/{SERVICES[signal]}/Export")
            return bytes(export(body, timeout=10, metadata=metadata, compression=compression))


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Grpc]:
    """The real server, tokens required even on loopback, a 64 KiB message cap."""
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             otlp_grpc_port=free_port(), scrape_targets="",
                             anonymous_on_loopback=False, max_body_bytes=MAX_MESSAGE,
                             ingest_read_timeout_s=2.0)
    token_store = TokenStore(settings.data_dir / TOKENS_FILE)
    tokens = {"ingest": token_store.add("exporter", None),
              "viewer": token_store.add("grafana", Role.VIEWER),
              "serve": stack_credential(settings.data_dir, "serve")}
    store = Store(settings.db_path)
    app = create_app(settings, store)
    try:
        with serving(app, settings.server_port, settings):
            yield Grpc(f"127.0.0.1:{settings.otlp_grpc_port}", store, app, tokens)
    finally:
        store.close()


def refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value


@pytest.mark.parametrize(("token", "code", "says"), [
    (None, grpc.StatusCode.UNAUTHENTICATED, "needs a token with the ingest role"),
    ("not-a-token-of-this-server-0123456789", grpc.StatusCode.UNAUTHENTICATED,
     "unknown token"),
    ("viewer", grpc.StatusCode.PERMISSION_DENIED, "grafana (viewer) may not export"),
])
def test_a_caller_without_the_ingest_role_is_refused_and_writes_nothing(
        receiver: Grpc, token: str | None, code: grpc.StatusCode, says: str) -> None:
    err = refusal(lambda: receiver.call("traces", traces(span()),
                                        receiver.tokens.get(token or "", token)))
    assert err.code() == code and says in (err.details() or "")
    assert receiver.store.query("SELECT count(*) FROM spans").rows == [(0,)]


def test_malformed_protobuf_is_invalid_argument(receiver: Grpc) -> None:
    err = refusal(lambda: receiver.call("traces", b"\x0a\xff\xff\xff\xff\x0f garbage",
                                        receiver.tokens["ingest"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()


@pytest.mark.parametrize("compression", [None, grpc.Compression.Gzip], ids=["plain", "gzip"])
def test_a_message_over_the_cap_is_resource_exhausted_compressed_or_not(
        receiver: Grpc, compression: grpc.Compression | None) -> None:
    # Zeros compress ~1000x: on the wire the gzip one is far under the cap.
    body = traces(span(name="x" * (4 * MAX_MESSAGE)))
    assert compression is None or len(gzip.compress(body)) < MAX_MESSAGE
    err = refusal(lambda: receiver.call("traces", body, receiver.tokens["ingest"],
                                        compression))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert receiver.store.query("SELECT count(*) FROM spans").rows == [(0,)]


def test_full_ingest_buffers_are_unavailable_with_a_retry_delay(receiver: Grpc) -> None:
    budget: MemoryBudget = receiver.app.state.budget
    budget.acquire(budget.limit, source="others")  # other exports hold every buffer
    try:
        err = refusal(lambda: receiver.call("traces", traces(span()), receiver.tokens["ingest"]))
    finally:
        budget.release(budget.limit, source="others")
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "retry" in (err.details() or "")
    [details] = [v for k, v in err.trailing_metadata() or () if k == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.seconds == 1
    # Once buffers free up, the retry lands.
    receiver.call("traces", traces(span()), receiver.tokens["ingest"])
    assert receiver.store.query("SELECT count(*) FROM spans").rows == [(1,)]


def test_records_out_of_range_are_left_out_and_the_rest_committed(receiver: Grpc) -> None:
    good = span(kind=2)
    reply = ExportTraceServiceResponse.FromString(receiver.call(
        "traces", traces(good, span(start_time_unix_nano=WRAPS, end_time_unix_nano=TOP)),
        receiver.tokens["ingest"]))
    assert reply.partial_success.rejected_spans == 1
    assert "out of range" in reply.partial_success.error_message
    assert receiver.store.query("SELECT span_id FROM spans").rows == [(good.span_id.hex(),)]


@pytest.mark.parametrize("token", ["ingest", "serve"])
def test_provenance_needs_the_serving_stacks_credential_over_grpc_too(
        receiver: Grpc, token: str) -> None:
    inference = f"inf-{secrets.token_hex(4)}"
    body = logs(provenance_record(inference),
                LogRecord(time_unix_nano=NOW, body=AnyValue(string_value="kept")))
    reply = ExportLogsServiceResponse.FromString(
        receiver.call("logs", body, receiver.tokens[token]))
    chained = receiver.store.query("SELECT inference_id FROM provenance").rows
    if token == "serve":
        assert reply.partial_success.rejected_log_records == 0 and chained == [(inference,)]
    else:
        assert reply.partial_success.rejected_log_records == 1 and chained == []
        assert "serving stack's credential" in reply.partial_success.error_message


@contextmanager
def bare_receiver(tmp_path: Path, **options: Any) -> Iterator[int]:
    """The gRPC receiver alone (anonymous callers allowed) with ``options``; its port."""
    store = Store(tmp_path / "t.duckdb")
    writer = BatchWriter(store)
    receiver = GrpcReceiver(
        GrpcOptions("127.0.0.1", free_port(), MAX_MESSAGE, **options), writer,
        MemoryBudget(2**20), Authenticator(TokenStore(tmp_path / "tokens.json"), lambda: "",
                                           anonymous=True),
        ReceiverMetrics(CollectorRegistry()))
    try:
        yield receiver.start()
    finally:
        receiver.close()
        writer.close()
        store.close()


def test_a_connection_that_never_speaks_is_closed(tmp_path: Path) -> None:
    """No HTTP/2 preface within the handshake deadline: the server hangs up."""
    with bare_receiver(tmp_path, handshake_s=1.0) as port, \
            socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        started = time.monotonic()
        while sock.recv(1024):  # its SETTINGS frame, maybe a GOAWAY, then the close
            pass
        assert time.monotonic() - started < 10


class _Wire:
    """A raw HTTP/2 connection to the gRPC port, as an attacker (or a broken client) drives
    it: streams opened, message bytes sent only as the server's flow control allows."""

    def __init__(self, target: str) -> None:
        import h2.config
        import h2.connection

        host, port = target.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(0.05)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.ended: dict[int, dict[str, str]] = {}  # stream -> its trailers (or headers)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def open(self, signal: str, token: str | None = None, end: bool = False) -> int:
        stream = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path",
                   f"/{SERVICES[signal]}/Export"), (":authority", "aiops"),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        self.conn.send_headers(stream, headers, end_stream=end)
        self.flush()
        return stream

    def send(self, stream: int, data: bytes) -> int:
        """As much of ``data`` as the stream's window takes now; how much that was."""
        if stream in self.ended:
            return 0
        n = min(len(data), self.conn.local_flow_control_window(stream),
                self.conn.max_outbound_frame_size)
        if n > 0:
            self.conn.send_data(stream, data[:n])
            self.flush()
        return n

    def pump(self, seconds: float) -> None:
        """Read what the server sends for ``seconds`` (answers, window updates)."""
        import h2.events

        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    fields = {(k.decode() if isinstance(k, bytes) else k):
                              (v.decode() if isinstance(v, bytes) else v)
                              for k, v in event.headers}
                    if "grpc-status" in fields:
                        self.ended[event.stream_id] = fields
                elif isinstance(event, h2.events.StreamReset):
                    self.ended.setdefault(event.stream_id, {"reset": str(event.error_code)})
            self.flush()

    def close(self) -> None:
        self.sock.close()


def _prefix(length: int) -> bytes:
    """gRPC's message prefix: not compressed, then the length the message declares."""
    return b"\x00" + length.to_bytes(4, "big")


def test_a_refused_callers_message_is_never_asked_for(receiver: Grpc) -> None:
    """Streams with no token that declare the largest message and keep sending: each is
    answered UNAUTHENTICATED from its metadata, and none is let send more than its small
    initial window, so refused callers cost the server next to nothing."""
    wire = _Wire(receiver.target)
    try:
        streams = [wire.open("logs") for _ in range(16)]
        body = _prefix(MAX_MESSAGE) + b"\x00" * MAX_MESSAGE
        sent = dict.fromkeys(streams, 0)
        for _ in range(6):
            for s in streams:
                sent[s] += wire.send(s, body[sent[s]:])
            wire.pump(0.3)
        assert {s: wire.ended.get(s, {}).get("grpc-status") for s in streams} == \
            dict.fromkeys(streams, str(grpc.StatusCode.UNAUTHENTICATED.value[0]))
        assert max(sent.values()) <= 64 * 1024, sent  # never the 64 KiB message in full
    finally:
        wire.close()
    assert receiver.app.state.budget.used == 0


def test_an_admitted_stream_that_stalls_holds_its_reservation_only_until_the_deadline(
        receiver: Grpc) -> None:
    """An ingest token's stream declares the largest message, sends half and stalls: it holds
    at most that message of the budget, its token's share bounds how many such streams it
    may hold, and at the read deadline it is answered DEADLINE_EXCEEDED and holds nothing."""
    budget: MemoryBudget = receiver.app.state.budget
    wire = _Wire(receiver.target)
    try:
        stream = wire.open("logs", receiver.tokens["ingest"])
        half = _prefix(MAX_MESSAGE) + b"\x00" * (MAX_MESSAGE // 2)
        sent = 0
        for _ in range(20):
            sent += wire.send(stream, half[sent:])
            if sent == len(half):
                break
            wire.pump(0.05)
        assert sent == len(half)
        assert 0 < budget.used <= MAX_MESSAGE, (budget.used, wire.ended)
        wire.pump(4.0)  # the fixture's read deadline is 2 s
        assert wire.ended[stream]["grpc-status"] == str(
            grpc.StatusCode.DEADLINE_EXCEEDED.value[0]), wire.ended
        assert budget.used == 0
    finally:
        wire.close()
    # The receiver is fine afterwards.
    reply = ExportTraceServiceResponse.FromString(
        receiver.call("traces", traces(span()), receiver.tokens["ingest"]))
    assert reply.partial_success.rejected_spans == 0


def test_a_call_with_no_message_is_answered_invalid_argument(receiver: Grpc) -> None:
    wire = _Wire(receiver.target)
    try:
        stream = wire.open("traces", receiver.tokens["ingest"], end=True)
        wire.pump(2.0)
        assert wire.ended[stream]["grpc-status"] == str(
            grpc.StatusCode.INVALID_ARGUMENT.value[0]), wire.ended
        assert "no message" in wire.ended[stream]["grpc-message"]
    finally:
        wire.close()


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    """Past ``max_connections`` open on the port, a new connection is closed as it comes (an
    attacker cannot fill the process' descriptors through it); one that was held gets its
    slot back when it goes."""

    def closed_at_once(sock: socket.socket) -> bool:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        sock.settimeout(1.0)
        try:
            while sock.recv(1024):  # the server's SETTINGS, if it keeps the connection
                pass
            return True
        except TimeoutError:
            return False  # still open
        except ConnectionResetError:
            return True

    held: list[socket.socket] = []
    with bare_receiver(tmp_path, max_connections=4) as port:
        try:
            for _ in range(4):
                held.append(socket.create_connection(("127.0.0.1", port)))
                assert not closed_at_once(held[-1])
            held.append(socket.create_connection(("127.0.0.1", port)))
            assert closed_at_once(held[-1])
            held.pop(0).close()
            time.sleep(0.5)
            held.append(socket.create_connection(("127.0.0.1", port)))
            assert not closed_at_once(held[-1])
        finally:
            for sock in held:
                sock.close()


# --- One connection gate for every listener (aiops.admission) ------------------------------

def _until(condition: Any, timeout_s: float = 10.0) -> None:
    """Wait for the server to have taken in what the test opened (accepts run on its loops)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.05)


def _export_ok(target: str) -> bool:
    """A traces export from 127.0.0.1 over gRPC: True when stored, False when refused. Its
    channel's connection goes with it (no process-wide subchannel pool keeping it)."""
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]
                               ) as channel:
        export = channel.unary_unary(f"/{SERVICES['traces']}/Export")
        try:
            export(traces(span()), timeout=5, wait_for_ready=False)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc
            return False
    return True


@contextmanager
def _gated_server(tmp_path: Path, **settings_: Any) -> Iterator[tuple[str, str, FastAPI]]:
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             otlp_grpc_port=free_port(), scrape_targets="", analytics=False,
                             retention_hours=0, server_header_timeout_s=30.0, **settings_)
    store = Store(settings.db_path)
    app = create_app(settings, store)
    try:
        with serving(app, settings.server_port, settings) as url:
            yield url, f"127.0.0.1:{settings.otlp_grpc_port}", app
    finally:
        store.close()


def test_an_address_has_one_share_of_connections_over_http_and_grpc_together(
        tmp_path: Path) -> None:
    """An address holding its share in idle HTTP connections gets no gRPC connection either
    (and the reverse), while other addresses are served on both."""
    import httpx

    held: list[socket.socket] = []
    with _gated_server(tmp_path, server_max_connections_per_client=8) as (url, target, app):
        host, port = url.removeprefix("http://").split(":")
        try:
            gate = app.state.connections
            for _ in range(8):
                held.append(socket.create_connection((host, int(port))))
            _until(lambda: gate.open(source="127.0.0.1") == 8)
            assert not _export_ok(target)  # gRPC: closed at accept, a retryable UNAVAILABLE
            other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
            assert other.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            for sock in held:
                sock.close()
            held.clear()
            _until(lambda: gate.open(source="127.0.0.1") == 0)
            assert _export_ok(target)
            _until(lambda: gate.open(source="127.0.0.1") == 0)
            # The reverse: the share held on the gRPC port, HTTP refuses the address.
            grpc_host, grpc_port = target.split(":")
            for _ in range(8):
                held.append(socket.create_connection((grpc_host, int(grpc_port))))
            _until(lambda: gate.open(source="127.0.0.1") == 8)
            refused = httpx.get(f"{url}/readyz")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert app.state.connections.refused["source"] >= 2
        finally:
            for sock in held:
                sock.close()


def test_idle_http_connections_that_fill_the_server_make_room_for_a_grpc_exporter(
        tmp_path: Path) -> None:
    """Two addresses fill the whole server with idle HTTP connections: a gRPC exporter from a
    third is still served, the longest-idle HTTP connection closed for it."""
    held: list[socket.socket] = []
    with _gated_server(tmp_path, server_max_connections_per_client=8,
                       server_max_connections=16) as (url, target, app):
        port = int(url.rsplit(":", 1)[1])
        try:
            for source in ("127.0.0.10", "127.0.0.11"):
                for _ in range(8):
                    held.append(socket.create_connection(("127.0.0.1", port),
                                                         source_address=(source, 0)))
            _until(lambda: app.state.connections.open() == 16)
            assert _export_ok(target)
            assert app.state.connections.evicted >= 1
        finally:
            for sock in held:
                sock.close()


def test_a_connection_straight_to_the_receiver_behind_the_relay_is_refused(
        tmp_path: Path) -> None:
    from aiops.admission import ConnectionGate

    store = Store(tmp_path / "t.duckdb")
    writer = BatchWriter(store)
    receiver = GrpcReceiver(
        GrpcOptions("127.0.0.1", free_port(), MAX_MESSAGE), writer, MemoryBudget(2**20),
        Authenticator(TokenStore(tmp_path / "tokens.json"), lambda: "", anonymous=True),
        ReceiverMetrics(CollectorRegistry()), connections=ConnectionGate(16, 8))
    try:
        port = receiver.start()
        assert _export_ok(f"127.0.0.1:{port}")
        assert receiver._relay is not None
        behind = f"127.0.0.1:{receiver._relay.upstream_port}"
        with grpc.insecure_channel(behind) as channel:
            export = channel.unary_unary(f"/{SERVICES['traces']}/Export")
            with pytest.raises(grpc.RpcError) as refused:
                export(traces(span()), timeout=5)
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert f"port {port}" in (refused.value.details() or "")
    finally:
        receiver.close()
        writer.close()
        store.close()


def test_idle_grpc_connections_that_fill_the_server_make_room_for_http(
        tmp_path: Path) -> None:
    """The reverse: silent connections to the gRPC port fill the server; /readyz and an
    export over HTTP are still served, the longest-idle gRPC connection closed for each."""
    import httpx

    held: list[socket.socket] = []
    with _gated_server(tmp_path, server_max_connections_per_client=8,
                       server_max_connections=16) as (url, target, app):
        port = int(target.rsplit(":", 1)[1])
        try:
            for source in ("127.0.0.10", "127.0.0.11"):
                for _ in range(8):
                    held.append(socket.create_connection(("127.0.0.1", port),
                                                         source_address=(source, 0)))
            _until(lambda: app.state.connections.open("grpc") == 16)
            assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            export = httpx.post(f"{url}/v1/traces", content=traces(span()), timeout=5,
                                headers={"content-type": "application/x-protobuf"})
            assert export.status_code == 200, export.text
            assert app.state.connections.evicted >= 1
        finally:
            for sock in held:
                sock.close()

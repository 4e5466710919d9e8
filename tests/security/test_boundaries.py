"""The server's trust boundaries, tried as an attacker would (P18): nothing of a body is read
before its caller is known, every body is capped while it is read, connections before auth
time out, a DNS-rebinding page is refused, a query cannot leave the server degraded, a bad
record fails alone, and every row says which credential wrote it."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from aiops.auth import Role, TokenStore, stack_credential
from aiops.config import Settings, load_settings
from aiops.ledger import PROVENANCE_EVENT
from aiops.querywatch import QueryWatch
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port, running_server
from collectors.otlp.writer import BatchWriter, Unstorable
from tests.loopback import serving
from tests.security.test_ingest import (
    NOW,
    PROTOBUF,
    export,
    logs,
    read_response,
    span,
    traces,
)

ADMIN = "admin-" + "a" * 40


@pytest.fixture
def closed(tmp_path: Path) -> Iterator[tuple[str, Settings, dict[str, str], Store]]:
    """A loopback server with anonymous access off, tokens of each kind, short limits."""
    settings = load_settings(
        data_dir=tmp_path / "data", server_port=free_port(), scrape_targets="",
        analytics=False, retention_hours=0, admin_token=ADMIN, anonymous_on_loopback=False,
        slack_signing_secret="s" * 32, server_header_timeout_s=1.0,
        server_max_connections_per_client=40, ingest_read_timeout_s=2.0, ingest_memory_mb=8)
    tokens = TokenStore(settings.data_dir / "tokens.json")
    made = {"viewer": tokens.add("grafana", Role.VIEWER), "ingest": tokens.add("app", None),
            "other": tokens.add("other-app", None),
            "bound": tokens.add("edge", None, services=("edge-*",)),
            "serve": stack_credential(settings.data_dir, "serve"),
            "ebpf": stack_credential(settings.data_dir, "ebpf")}
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port, settings) as url:
            yield url, settings, made, store
    finally:
        store.close()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def raw(url: str, request: bytes, wait_s: float = 3.0) -> bytes:
    """Send ``request`` as is on a new connection; what comes back within ``wait_s``."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(request)
        return read_response(sock, wait_s)


def headers_only(path: str, length: int, token: str | None = None,
                 content_type: str = "application/json") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"{auth}Content-Length: {length}\r\n\r\n").encode() + b"{"


# --- 1. auth and caps before the body -------------------------------------------------------

def test_a_caller_without_a_token_is_refused_before_its_body_is_read(closed: Any) -> None:
    url, *_ = closed
    started = time.monotonic()
    reply = raw(url, headers_only("/api/v1/sql", 700 * 2**20))
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert time.monotonic() - started < 2  # not the 74 s of reading 700 MiB first
    assert b"connection: close" in reply.lower()


def test_a_body_over_its_routes_cap_is_refused_from_its_declared_length(closed: Any) -> None:
    url, _, tokens, _ = closed
    for path, token in (("/api/v1/sql", tokens["viewer"]), ("/v1/slack/command", None),
                        ("/v1/chatops", ADMIN)):
        reply = raw(url, headers_only(path, 200 * 2**20, token))
        assert reply.startswith(b"HTTP/1.1 413"), (path, reply[:200])


def test_a_chunked_body_is_cut_at_its_routes_cap_while_it_streams(closed: Any) -> None:
    url, _, tokens, _ = closed
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        yield b'{"sql": "SELECT 1", "params": ["'
        for _ in range(64):  # 64 MiB offered; the SQL route takes 8
            sent += 2**20
            yield b"x" * 2**20
        yield b'"]}'

    try:
        r = httpx.post(f"{url}/api/v1/sql", content=body(), timeout=30,
                       headers={**bearer(tokens["viewer"]), "content-type": "application/json"})
        assert r.status_code == 413, r.text
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        pass  # the server answered and closed while the client was still sending
    assert sent < 32 * 2**20


def test_a_refused_exporter_reads_its_answer_not_a_connection_reset(closed: Any) -> None:
    # A wrong token with a body within the route's cap: the body is read and dropped, so the
    # client sees a final 401 (an exporter retries network errors, not a 401).
    url, *_ = closed
    body = traces(*[span() for _ in range(80_000)])
    assert 2**20 < len(body) < 16 * 2**20
    r = export(url, "traces", body, authorization="Bearer not-a-token-at-all-1234")
    assert r.status_code == 401


# --- 4. connections before auth -------------------------------------------------------------

def test_idle_and_byte_a_minute_connections_are_closed_after_the_header_timeout(
        closed: Any) -> None:
    url, *_ = closed
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(30)]
    try:
        for s in socks[10:]:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        time.sleep(0.6)
        for s in socks[20:]:
            s.sendall(b"a")  # still trickling: the deadline is for the headers, not a byte
        time.sleep(1.6)
        for s in socks:
            s.settimeout(2)
            assert s.recv(100) == b"", "an unauthenticated connection outlived the timeout"
    finally:
        for s in socks:
            s.close()
    assert httpx.get(f"{url}/readyz").status_code == 200


def test_one_address_cannot_hold_more_than_its_share_of_connections(closed: Any) -> None:
    url, settings, *_ = closed
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(
        settings.server_max_connections_per_client)]
    try:
        time.sleep(0.2)
        reply = raw(url, b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503") and b"retry-after" in reply.lower()
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)
    assert httpx.get(f"{url}/readyz").status_code == 200


def test_many_addresses_of_idle_connections_cannot_fill_the_server(tmp_path: Path) -> None:
    """Five addresses, each under its per-address cap, hold idle connections past the
    server's limit (the attack: 17 x 250 idle, /readyz 503): a new client that sends its
    request is served, the longest-idle connections closed to make room."""
    settings = load_settings(
        data_dir=tmp_path / "data", server_port=free_port(), scrape_targets="",
        analytics=False, retention_hours=0, server_header_timeout_s=30.0,
        server_max_connections_per_client=8, server_max_connections=16)
    store = Store(settings.db_path)
    socks: list[socket.socket] = []
    try:
        with serving(create_app(settings, store), settings.server_port, settings) as url:
            port = settings.server_port
            for i in range(5):
                for _ in range(8):
                    socks.append(socket.create_connection(
                        ("127.0.0.1", port), source_address=(f"127.0.0.{10 + i}", 0)))
            time.sleep(0.3)
            for _ in range(5):
                r = httpx.get(f"{url}/readyz", timeout=5)
                assert r.status_code == 200, r.text
            ingest = httpx.post(f"{url}/v1/traces", content=traces(span()), timeout=5,
                                headers={"content-type": "application/x-protobuf"})
            assert ingest.status_code == 200, ingest.text
    finally:
        for sock in socks:
            sock.close()
        store.close()


def test_one_token_holds_at_most_its_requests_in_flight_across_http_and_grpc(
        tmp_path: Path) -> None:
    """A token with ``server_max_requests_per_token`` requests in flight (two uploads that
    stall over HTTP) gets a retryable 503 for a third, over HTTP and over gRPC alike; another
    token exports meanwhile; once the stalled ones end, the token is served again."""
    import grpc

    from collectors.otlp.grpc_receiver import SERVICES

    settings = load_settings(
        data_dir=tmp_path / "data", server_port=free_port(), otlp_grpc_port=free_port(),
        scrape_targets="", analytics=False, retention_hours=0, anonymous_on_loopback=False,
        server_max_requests_per_token=2, ingest_read_timeout_s=3.0)
    tokens = TokenStore(settings.data_dir / "tokens.json")
    busy, other = tokens.add("busy-app", None), tokens.add("other-app", None)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port, settings) as url:
            host, port = url.removeprefix("http://").split(":")
            stalled = []
            for _ in range(2):
                sock = socket.create_connection((host, int(port)))
                sock.sendall(headers_only("/v1/traces", 1000, busy,
                                          "application/x-protobuf"))
                stalled.append(sock)
            time.sleep(0.3)
            third = httpx.post(f"{url}/v1/traces", content=traces(span()), timeout=5,
                               headers={**bearer(busy), "content-type":
                                        "application/x-protobuf"})
            assert third.status_code == 503 and third.headers["retry-after"] == "1"
            assert "requests in flight" in third.json()["error"]
            with grpc.insecure_channel(f"127.0.0.1:{settings.otlp_grpc_port}") as channel:
                export = channel.unary_unary(f"/{SERVICES['traces']}/Export")
                with pytest.raises(grpc.RpcError) as refused:
                    export(traces(span()), timeout=5,
                           metadata=(("authorization", f"Bearer {busy}"),))
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                export(traces(span()), timeout=5,
                       metadata=(("authorization", f"Bearer {other}"),))  # others: served
            for sock in stalled:
                sock.close()
            time.sleep(0.5)
            again = httpx.post(f"{url}/v1/traces", content=traces(span()), timeout=5,
                               headers={**bearer(busy), "content-type":
                                        "application/x-protobuf"})
            assert again.status_code == 200, again.text
    finally:
        store.close()


def test_a_websocket_upgrade_does_not_keep_a_connection_slot(closed: Any) -> None:
    url, settings, *_ = closed
    upgrade = (b"GET /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
               b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    for _ in range(settings.server_max_connections_per_client + 5):
        raw(url, upgrade, wait_s=1)
    assert httpx.get(f"{url}/readyz").status_code == 200


# --- 5. DNS rebinding -----------------------------------------------------------------------

def test_a_request_naming_another_host_is_refused_on_a_loopback_server(
        server: Any) -> None:
    # Anonymous loopback access is on (the default): exactly what a rebinding page would use.
    evil = {"host": "attacker.example"}
    r = httpx.post(f"{server.url}/api/v1/sql", json={"sql": "SELECT 1"}, headers=evil)
    assert r.status_code == 400 and "Host" in r.json()["error"]
    r = httpx.post(f"{server.url}/v1/logs", content=logs(LogRecord(time_unix_nano=NOW)),
                   headers={**PROTOBUF, **evil})
    assert r.status_code == 400 and server.store.count("logs") == 0
    for ok in ("localhost", "127.0.0.1", f"127.0.0.1:{server.settings.server_port}"):
        r = httpx.post(f"{server.url}/api/v1/sql", json={"sql": "SELECT 1"},
                       headers={"host": ok})
        assert r.status_code == 200, (ok, r.text)


# --- 6. a bad record fails alone ------------------------------------------------------------

def _provenance(model: Any) -> LogRecord:
    value = AnyValue(int_value=model) if isinstance(model, int) else AnyValue(
        string_value=model)
    return LogRecord(time_unix_nano=NOW, event_name=PROVENANCE_EVENT,
                     trace_id=secrets.token_bytes(16),
                     attributes=[KeyValue(key="model", value=value),
                                 KeyValue(key="inference_id",
                                          value=AnyValue(string_value="i-1"))])


def test_a_malformed_provenance_record_is_rejected_alone_while_others_export(
        closed: Any) -> None:
    url, _, tokens, store = closed
    codes: list[int] = []

    def valid() -> None:
        r = export(url, "traces", traces(span()), **bearer(tokens["other"]))
        codes.append(r.status_code)

    threads = [threading.Thread(target=valid) for _ in range(40)]
    for t in threads:
        t.start()
    bad = export(url, "logs", logs(_provenance(7), _provenance("chat")),
                 **bearer(tokens["serve"]))
    for t in threads:
        t.join()
    assert bad.status_code == 200, bad.text
    assert codes == [200] * 40
    assert store.count("provenance") == 1 and store.count("spans") == 40


def test_rows_that_cannot_be_stored_fail_their_own_request_not_the_group_commit(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "w.duckdb")
    writer = BatchWriter(store, max_delay_s=0.2)
    good = pa.table({"trace_id": ["a" * 32], "span_id": ["b" * 16], "name": ["op"],
                     "start_time": pa.array([NOW], pa.timestamp("ns"))})

    async def both() -> list[Any]:
        return await asyncio.gather(
            writer.submit({"spans": good}),
            writer.submit({}, {"provenance": [{"time": NOW, "model": {"a": 1}}]}),
            return_exceptions=True)

    try:
        results = asyncio.run(both())
        assert results[0] == 1
        assert isinstance(results[1], Unstorable)
        assert store.count("spans") == 1 and store.count("provenance") == 0
    finally:
        writer.close()
        store.close()


# --- 7. which credential wrote a row --------------------------------------------------------

def _traces_as(service: str) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=[KeyValue(key="service.name",
                                               value=AnyValue(string_value=service))]),
        scope_spans=[ScopeSpans(spans=[span()])])]).SerializeToString()


def test_every_row_records_the_credential_that_exported_it(closed: Any) -> None:
    url, _, tokens, store = closed
    assert export(url, "traces", _traces_as("chat"), **bearer(tokens["ingest"])).is_success
    assert export(url, "traces", _traces_as("chat"), **bearer(tokens["other"])).is_success
    rows = store.query("SELECT ingest_credential, count(*) FROM spans GROUP BY 1 "
                       "ORDER BY 1").rows
    assert rows == [("app", 1), ("other-app", 1)]


def test_a_bound_credential_writes_only_as_its_services(closed: Any) -> None:
    url, _, tokens, store = closed
    for token, service, kept in ((tokens["ebpf"], "chat", 0), (tokens["ebpf"], "aiops-ebpf", 1),
                                 (tokens["bound"], "edge-7", 1), (tokens["bound"], "chat", 0)):
        r = export(url, "traces", _traces_as(service), **bearer(token))
        assert r.status_code == 200, r.text
        reply = ExportTraceServiceResponse.FromString(r.content)
        assert reply.partial_success.rejected_spans == 1 - kept
        if not kept:
            assert "may write only as" in reply.partial_success.error_message
    assert sorted(store.query("SELECT service_name FROM spans").rows) == [
        ("aiops-ebpf",), ("edge-7",)]


# --- 8. stalled uploads of one client -------------------------------------------------------

def test_stalled_uploads_of_one_client_leave_the_others_their_share(closed: Any) -> None:
    url, _, tokens, _ = closed
    host, port = url.removeprefix("http://").split(":")
    size = 512 * 1024
    stalled = []
    for _ in range(16):  # all but one byte of each, then nothing: 8 MiB announced
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  f"application/x-protobuf\r\nAuthorization: Bearer {tokens['ingest']}\r\n"
                  f"Content-Length: {size}\r\n\r\n".encode() + b"\0" * (size - 1))
        stalled.append(s)
    try:
        time.sleep(0.5)
        body = traces(*[span() for _ in range(200)])
        for _ in range(5):
            r = export(url, "traces", body, **bearer(tokens["other"]))
            assert r.status_code == 200, r.text
    finally:
        for s in stalled:
            s.close()


# --- 2. a query cannot leave the server degraded --------------------------------------------

def _vm_data_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmData")


def test_a_memory_bomb_leaves_the_memory_cap_whole_for_what_follows(tmp_path: Path) -> None:
    with running_server(tmp_path, server_memory_mb=3072, analytics=False,
                        retention_hours=0) as (settings, pid):
        before = _vm_data_mib(pid)
        r = httpx.post(f"{settings.server_url}/api/v1/sql", timeout=60, json={
            "sql": "SELECT repeat('x', 100000000) s FROM range(256)"})
        assert r.status_code == 413 and "memory" in r.json()["error"], r.text
        time.sleep(1)
        assert _vm_data_mib(pid) < before + 1024  # given back, not kept by the allocator
        big = traces(*[span(attributes=[KeyValue(key="k", value=AnyValue(
            string_value="v" * 150))]) for _ in range(60_000)])
        assert len(big) > 10 * 2**20
        assert export(settings.server_url, "traces", big).status_code == 200
        r = httpx.post(f"{settings.server_url}/api/v1/sql", json={"sql": "SELECT 1"},
                       timeout=5)
        assert r.json()["rows"] == [[1]]


def test_a_query_building_a_huge_aggregate_fails_alone(tmp_path: Path) -> None:
    # 20M lists of 100 bytes: DuckDB's pool (memory_limit) or the watchdog stops it.
    with running_server(tmp_path, sql_max_memory_mb=256, analytics=False,
                        retention_hours=0) as (settings, _):
        r = httpx.post(f"{settings.server_url}/api/v1/sql", timeout=60, json={
            "sql": "SELECT list(repeat('y', 100)) FROM range(20000000)"})
        assert r.status_code == 413 and "memory" in r.json()["error"], r.text
        r = httpx.post(f"{settings.server_url}/api/v1/sql", json={"sql": "SELECT 1"})
        assert r.json()["rows"] == [[1]]


def test_the_watchdog_interrupts_growth_outside_the_pool_and_not_the_pools_own() -> None:
    fired: list[str] = []
    held = []
    with QueryWatch(lambda: fired.append("x"), 30, 64 * 2**20, period_s=0.01) as watch:
        for _ in range(40):  # 160 MiB the pool does not hold
            held.append(bytearray(4 * 2**20))
            time.sleep(0.005)
        time.sleep(0.1)
    assert watch.reason == "memory" and fired
    held.clear()
    grown = [0]
    with QueryWatch(lambda: fired.append("y"), 30, 64 * 2**20, period_s=0.01,
                    pooled=lambda: grown[0]) as watch:
        for _ in range(40):  # the same, reported as the buffer pool's (bounded elsewhere)
            held.append(bytearray(4 * 2**20))
            grown[0] += 4 * 2**20
            time.sleep(0.005)
        time.sleep(0.1)
    assert watch.reason == "" and fired == ["x"]

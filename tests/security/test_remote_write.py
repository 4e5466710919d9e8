"""Prometheus remote write holds up as OTLP/HTTP does: the caller is checked before the body is
read, malformed, oversized (snappy bombs included) and 2.0 bodies get statuses Prometheus does
not retry, samples with times outside int64 nanoseconds are left out, and a stalled upload gets
408 within the read deadline."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import cramjam
import pytest

from aiops.auth import TOKENS_FILE, Role, TokenStore
from aiops.config import load_settings
from aiops.errors import PayloadTooLarge
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.collectors.test_remote_write import MAX_BODY, post, server, write_request
from tests.conftest import RunningServer
from tests.loopback import serving
from tests.security.test_ingest import read_response

__all__ = ["server"]  # the fixture, shared with the functional tests


@pytest.mark.parametrize(("body", "headers", "code", "says"), [
    (b"\x05not snappy", {}, 400, "not valid snappy"),
    (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), {}, 400, "not a remote write 1.0"),
    # A 3-byte body announcing 10 MiB once decompressed: refused before decompressing.
    (b"\x80\x80\x80\x05\x00", {}, 413, "exceeds the limit"),
    (b"x" * (2 * MAX_BODY), {}, 413, "limit"),
    (b"", {"content-type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
     415, "remote write 2.0 is not supported"),
], ids=["bad-snappy", "bad-protobuf", "snappy-bomb", "oversized", "v2"])
def test_bad_writes_get_a_status_prometheus_does_not_retry(
        server: tuple[RunningServer, str], body: bytes, headers: dict[str, str], code: int,
        says: str) -> None:
    srv, token = server
    r = post(srv, body, token, **headers)
    assert r.status_code == code and says in r.text, (r.status_code, r.text)
    assert srv.store.query("SELECT count(*) FROM metric_points").rows == [(0,)]


def test_a_write_without_an_ingest_token_is_refused_before_its_body(
        server: tuple[RunningServer, str]) -> None:
    srv, _ = server
    viewer = TokenStore(srv.settings.data_dir / TOKENS_FILE).add("grafana", Role.VIEWER)
    body = write_request(({"__name__": "x", "job": "j"}, [(1.0, int(time.time() * 1000))]))
    assert post(srv, body, None).status_code == 401
    assert post(srv, body, viewer).status_code == 403
    assert srv.store.query("SELECT count(*) FROM metric_points").rows == [(0,)]


def test_samples_with_times_outside_int64_nanoseconds_are_left_out(
        server: tuple[RunningServer, str]) -> None:
    srv, token = server
    now_ms = int(time.time() * 1000)
    body = write_request(({"__name__": "x", "job": "j"},
                          [(1.0, now_ms), (2.0, 2**62), (3.0, -(2**62))]))
    assert post(srv, body, token).status_code == 204
    assert srv.store.query("SELECT value FROM metric_points").rows == [(1.0,)]


def test_a_stalled_write_gets_408_within_the_read_deadline(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             scrape_targets="", ingest_read_timeout_s=1.0)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port, settings):
            port = settings.server_port
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(f"POST /api/v1/write HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                             "Content-Type: application/x-protobuf\r\nContent-Length: 1000"
                             "\r\n\r\n".encode() + b"\x00" * 10)
                started = time.monotonic()
                reply = read_response(sock, 10)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
            assert time.monotonic() - started < 5
    finally:
        store.close()


def _empty_samples(n: int) -> bytes:
    """One series of ``n`` samples at value 0 and time 0: two bytes each on the wire, a row
    each once stored (how a 0.75 MiB body became 8.4M rows)."""
    return write_request(({"__name__": "x", "job": "j"}, [(0.0, 0)] * n))


def test_a_request_is_charged_and_capped_by_the_rows_it_becomes(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             scrape_targets="", remote_write_max_samples=1000)
    store = Store(settings.db_path)
    try:
        app = create_app(settings, store)
        with serving(app, settings.server_port, settings):
            srv = RunningServer(settings.server_url, store, settings)
            bomb = _empty_samples(20_000)
            assert len(bomb) < 3000  # about 14x smaller than what it decompresses to
            reply = post(srv, bomb, None)
            assert reply.status_code == 413, reply.text
            # Counted on the wire, the count stopping at the cap: never parsed.
            assert "1001 or more samples" in reply.json()["error"]
            assert "max_samples_per_send" in reply.json()["error"]
            assert store.query("SELECT count(*) FROM metric_points").rows == [(0,)]
            # Within the cap it is stored, charged per row (not per compressed byte).
            assert post(srv, _empty_samples(1000), None).status_code == 204
            assert store.query("SELECT count(*) FROM metric_points "
                               "WHERE name = 'x'").rows == [(1000,)]
            budget = app.state.budget
            assert budget.peak >= 1000 * 256 and budget.used == 0
    finally:
        store.close()


def test_a_snappy_header_announcing_more_than_snappy_can_expand_is_refused() -> None:
    from collectors.otlp.export import Charge
    from collectors.otlp.writer import MemoryBudget
    from collectors.remote_write import _decode

    budget = MemoryBudget(2**30)
    body = b"\x80\x80\x80\x02" + b"\x00" * 100  # announces 4 MiB from 104 bytes
    with pytest.raises(PayloadTooLarge, match="decompresses"):
        _decode(body, 16 * 2**20, Charge(budget))
    assert budget.peak == 0  # refused before anything was charged or decompressed


def test_a_bomb_is_counted_on_the_wire_and_refused_before_it_is_parsed() -> None:
    from collectors.otlp.export import Charge
    from collectors.otlp.writer import MemoryBudget
    from collectors.remote_write import PARSE_FACTOR, _decode

    budget = MemoryBudget(2**30)
    bomb = _empty_samples(2_000_000)  # 4 MB of two-byte samples, about 0.2 MB on the wire
    with pytest.raises(PayloadTooLarge, match="200001 or more samples"):
        _decode(bomb, 16 * 2**20, Charge(budget))
    # Charged its decompressed size while counted; the parse's charge was never taken.
    assert 4 * 10**6 <= budget.peak < PARSE_FACTOR * 4 * 10**6 / 2

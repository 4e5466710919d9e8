"""Prometheus remote write 1.0 into metric_points: Debian's real Prometheus, configured with
``remote_write`` to aiops and an ingest token, lands its samples; full buffers are a retryable
503. Hostile writes: tests/security/test_remote_write.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import cramjam
import httpx
import pytest
from fastapi import FastAPI
from google.protobuf.message import DecodeError as ProtoDecodeError
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from aiops.auth import TOKENS_FILE, Role, TokenStore, ensure_credential
from aiops.config import load_settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from collectors.otlp.writer import MemoryBudget
from collectors.remote_write import WriteRequest, _wire
from tests.conftest import RunningServer
from tests.loopback import serving
from tests.prometheus import running_prometheus

MAX_BODY = 64 * 1024
APPS: dict[str, FastAPI] = {}
HEADERS = {"content-type": "application/x-protobuf", "content-encoding": "snappy",
           "x-prometheus-remote-write-version": "0.1.0"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[RunningServer, str]]:
    """The server with tokens required on loopback too; an ingest token for the writer. The
    app is on ``RunningServer.settings``' side as ``APPS[url]`` for the budget test."""
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             scrape_targets="", anonymous_on_loopback=False,
                             max_body_bytes=MAX_BODY)
    token = TokenStore(settings.data_dir / TOKENS_FILE).add("prometheus-rw", None)
    store = Store(settings.db_path)
    app = APPS[settings.server_url] = create_app(settings, store)
    try:
        with serving(app, settings.server_port, settings):
            yield RunningServer(settings.server_url, store, settings), token
    finally:
        APPS.pop(settings.server_url, None)
        store.close()


def write_request(*series: tuple[dict[str, str], list[tuple[float, int]]]) -> bytes:
    req = WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for name, text in sorted(labels.items()):
            ts.labels.add(name=name, value=text)
        for value, stamp_ms in samples:
            ts.samples.add(value=value, timestamp=stamp_ms)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def post(server: RunningServer, body: bytes, token: str | None, **headers: str
         ) -> httpx.Response:
    auth = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.url}/api/v1/write", content=body,
                      headers={**HEADERS, **auth, **headers}, timeout=30)


def test_samples_become_metric_points_by_name_job_instance_and_labels(
        server: tuple[RunningServer, str]) -> None:
    srv, token = server
    now_ms = int(time.time() * 1000)
    body = write_request(
        ({"__name__": "http_requests_total", "job": "api", "instance": "10.0.0.1:9100",
          "code": "500"}, [(3.0, now_ms), (5.0, now_ms + 1000)]),
        ({"__name__": "queue_depth", "job": "api"}, [(7.0, now_ms)]),
        ({"job": "api"}, [(1.0, now_ms)]))  # no __name__: left out
    r = post(srv, body, token)
    assert r.status_code == 204, r.text
    rows = srv.store.query(
        "SELECT name, service_name, (resource_attributes->>'service.instance.id'), "
        "(attributes->>'code'), type, is_monotonic, value, epoch_ns(time) // 1000000, "
        "ingest_credential FROM metric_points ORDER BY name, time").rows
    assert rows == [
        ("http_requests_total", "api", "10.0.0.1:9100", "500", "sum", True, 3.0, now_ms,
         "prometheus-rw"),
        ("http_requests_total", "api", "10.0.0.1:9100", "500", "sum", True, 5.0,
         now_ms + 1000, "prometheus-rw"),
        ("queue_depth", "api", None, None, "gauge", None, 7.0, now_ms, "prometheus-rw")]


def test_full_buffers_are_503_with_retry_after(server: tuple[RunningServer, str]) -> None:
    srv, token = server
    body = write_request(({"__name__": "x", "job": "j"}, [(1.0, int(time.time() * 1000))]))
    budget: MemoryBudget = APPS[srv.url].state.budget
    budget.acquire(budget.limit, source="others")
    try:
        r = post(srv, body, token)
    finally:
        budget.release(budget.limit, source="others")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert post(srv, body, token).status_code == 204


def test_debians_prometheus_remote_writes_into_aiops(server: tuple[RunningServer, str],
                                                     tmp_path: Path) -> None:
    srv, _ = server
    data_dir = srv.settings.data_dir
    viewer = data_dir / "credentials" / "prometheus.token"
    ensure_credential(data_dir, "prometheus", Role.VIEWER)  # to scrape aiops' /metrics
    ingest = data_dir / "credentials" / "prometheus-rw.token"
    ensure_credential(data_dir, "prometheus-rw", None)  # to write
    host = srv.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "aiops", "metrics_path": "/metrics",
                            "authorization": {"credentials_file": str(viewer)},
                            "static_configs": [{"targets": [host]}]}],
        "remote_write": [{"url": f"{srv.url}/api/v1/write",
                          "authorization": {"credentials_file": str(ingest)},
                          "queue_config": {"batch_send_deadline": "1s"}}]}
    with running_prometheus(config, tmp_path):
        deadline = time.monotonic() + 60
        rows: list[tuple[object, ...]] = []
        while time.monotonic() < deadline and not rows:
            rows = srv.store.query(
                "SELECT service_name, value, (resource_attributes->>'service.instance.id') "
                "FROM metric_points WHERE scope_name = 'aiops.remote_write' AND name = 'up'"
            ).rows
            time.sleep(1)
    assert rows and rows[0] == ("aiops", 1.0, host), rows
    names = {r[0] for r in srv.store.query(
        "SELECT DISTINCT name FROM metric_points WHERE scope_name = 'aiops.remote_write'").rows}
    assert "aiops_otlp_rows_total" in names or "scrape_duration_seconds" in names, names


# -- The wire count (collectors/otlp/_wire.pyx count_write_request) ----------------------------

_series = st.lists(st.tuples(
    st.dictionaries(st.sampled_from(["__name__", "job", "le", "a"]), st.text(max_size=4),
                    max_size=3),
    st.lists(st.tuples(st.floats(allow_nan=False), st.integers(-2**40, 2**40)), max_size=6)),
    max_size=6)


@pytest.mark.skipif(_wire is None, reason="the compiled decoder is not built here")
@hypothesis_settings(max_examples=200, deadline=None)
@given(series=_series, cut=st.integers(0, 400), flip=st.integers(0, 400),
       limit=st.integers(0, 20))
def test_the_wire_count_is_the_parse_count_and_refuses_only_what_protobuf_refuses(
        series: list[tuple[dict[str, str], list[tuple[float, int]]]], cut: int, flip: int,
        limit: int) -> None:
    raw = bytes(cramjam.snappy.decompress_raw(write_request(*series)))
    counted = _wire.count_write_request(raw, 10**9)
    assert counted == (len(series), sum(len(s) for _, s in series))
    # Stopped at the limit, the count still says it was passed.
    early = _wire.count_write_request(raw, limit)
    assert (max(early) > limit) == (max(counted) > limit)
    # A damaged body: refused by the count only where protobuf refuses it too.
    damaged = bytearray(raw[:cut] if cut < len(raw) else raw)
    if damaged and flip < len(damaged) * 8:
        damaged[flip // 8 % len(damaged)] ^= 1 << (flip % 8)
    try:
        _wire.count_write_request(bytes(damaged), 10**9)
    except _wire.WireError:
        with pytest.raises(ProtoDecodeError):
            WriteRequest().FromString(bytes(damaged))

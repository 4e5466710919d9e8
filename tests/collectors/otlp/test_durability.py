"""What the receiver acknowledges survives SIGKILL; overload gets retryable answers and
bounded memory, and ingest recovers. Real `aiops server` subprocesses on loopback."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from aiops.config import Settings, load_settings
from aiops.stack import settings_env
from tests.conftest import free_port

pytestmark = pytest.mark.slow


PROTOBUF = {"content-type": "application/x-protobuf"}


def request_body(n: int) -> tuple[bytes, list[str]]:
    spans, ids = [], []
    now = time.time_ns()
    for _ in range(n):
        sid = secrets.token_bytes(8)
        ids.append(sid.hex())
        spans.append(Span(trace_id=secrets.token_bytes(16), span_id=sid, name="op",
                          start_time_unix_nano=now, end_time_unix_nano=now + 1000))
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    return req.SerializeToString(), ids


def start(settings: Settings) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "aiops", "server"],
                            env={**os.environ, **settings_env(settings)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{settings.server_url}/readyz").status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(data_dir=tmp_path, server_port=free_port(), log_level="WARNING")


def present(settings: Settings, ids: list[str]) -> int:
    r = httpx.post(f"{settings.server_url}/api/v1/sql", json={
        "sql": "SELECT count(DISTINCT span_id) FROM spans WHERE list_contains(?, span_id)",
        "params": [ids]}, timeout=60)
    r.raise_for_status()
    return int(r.json()["rows"][0][0])


def test_every_acknowledged_span_survives_sigkill_five_times(settings: Settings) -> None:
    acked: list[str] = []
    for _ in range(5):
        proc = start(settings)
        stop = threading.Event()

        def send(stop: threading.Event = stop) -> None:
            with httpx.Client(base_url=settings.server_url, timeout=10) as c:
                while not stop.is_set():
                    body, ids = request_body(200)
                    try:
                        if c.post("/v1/traces", content=body, headers=PROTOBUF).status_code \
                                == 200:
                            acked.extend(ids)
                    except httpx.HTTPError:
                        return  # the server is gone: whatever was unanswered is not acked

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of sustained ingest
        proc.wait()
        stop.set()
        for t in threads:
            t.join()
    proc = start(settings)
    try:
        assert len(acked) > 5 * 200
        assert present(settings, acked) == len(acked)
    finally:
        proc.terminate()
        proc.wait()


def rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


@pytest.fixture
def small(tmp_path: Path) -> Iterator[tuple[Settings, subprocess.Popen[bytes]]]:
    s = load_settings(data_dir=tmp_path, server_port=free_port(), log_level="WARNING",
                      ingest_memory_mb=8, duckdb_memory_mb=64)
    proc = start(s)
    yield s, proc
    proc.terminate()
    proc.wait()


def test_overload_is_refused_retryably_within_the_memory_limit_and_recovers(
    small: tuple[Settings, subprocess.Popen[bytes]],
) -> None:
    settings, proc = small
    body, _ = request_body(5_000)  # ~0.4 MiB: ~4.5 MiB reserved per request
    baseline = rss_mib(proc.pid, "VmRSS")
    statuses: list[tuple[int, str | None]] = []

    def flood() -> None:
        with httpx.Client(base_url=settings.server_url, timeout=60) as c:
            for _ in range(6):
                r = c.post("/v1/traces", content=body, headers=PROTOBUF)
                statuses.append((r.status_code, r.headers.get("retry-after")))

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = [s for s, _ in statuses]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) > 0
    assert all(retry == "1" for s, retry in statuses if s == 503)
    metrics = httpx.get(f"{settings.server_url}/metrics").text
    peak = next(float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("aiops_ingest_buffer_peak_bytes"))
    assert peak <= 8 * 2**20 + 12 * len(body)
    grown = rss_mib(proc.pid, "VmHWM") - baseline
    # Bounded by the ingest budget (8 MiB), DuckDB's buffer pool (64 MiB) and the decode
    # working set of the requests admitted at once; without the budget this grows with load.
    print(f"RSS grew by {grown:.0f} MiB")
    assert grown < 120, f"RSS grew by {grown:.0f} MiB under 8 + 64 MiB limits"
    # The flood is over: ingest works again.
    ok = httpx.post(f"{settings.server_url}/v1/traces", content=request_body(10)[0],
                    headers=PROTOBUF)
    assert ok.status_code == 200

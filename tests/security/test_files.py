"""The store's files are the aiops user's alone (issue P11, item 11): the data directory 0700
when aiops makes it; the DuckDB file, its WAL, the ledger anchors and the Parquet archive
0600; in an ``aiops server`` process everything under the data directory."""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from aiops.store import Store
from aiops_harness.bench.common import running_server

T = 1_700_000_000_000_000_000


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def loose(root: Path) -> dict[str, str]:
    """Everything under ``root`` (itself too) that group or others may use, with its mode."""
    found = {}
    for path in (root, *root.rglob("*")):
        if not path.is_symlink() and mode(path) & 0o077:
            found[str(path.relative_to(root.parent))] = oct(mode(path))
    return found


def spans(n: int, start: int) -> pa.Table:
    return pa.table({
        "trace_id": [f"{i:032x}" for i in range(1, n + 1)],
        "span_id": [f"{i:016x}" for i in range(1, n + 1)],
        "name": ["GET /"] * n, "service_name": ["svc"] * n,
        "start_time": pa.array([start] * n, pa.timestamp("ns")),
        "end_time": pa.array([start + 1000] * n, pa.timestamp("ns")),
        "duration_ns": [1000] * n,
    })


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The umask most shells have: without the store's own care its files would be 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_store_keeps_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = Store(data / "t.duckdb")
    try:
        store.append_many({"spans": spans(3, T)}, {
            "ledger": [{"time": T, "actor": "policy", "action_id": "act-1", "status": "done"}],
            "provenance": [{"time": T, "inference_id": "inf-1", "model": "m"}]})
        assert (data / "t.duckdb.wal").exists()  # written, not yet checkpointed
        assert store.archive("spans", T + 1) == 3
        store.append("spans", spans(1, T + 5))  # a WAL made anew after the checkpoint
        assert mode(data) == 0o700
        for name in ("t.duckdb", "t.duckdb.wal", "t.ledger.head", "t.provenance.head"):
            assert mode(data / name) == 0o600, name
        (archived,) = (data / "archive" / "spans").glob("*.parquet")
        assert mode(archived) == 0o600
        assert loose(data) == {}
    finally:
        store.close()


def test_files_from_before_are_made_private_at_open(tmp_path: Path) -> None:
    path = tmp_path / "data" / "t.duckdb"
    Store(path).close()
    path.chmod(0o644)
    (path.parent / "archive").chmod(0o755)
    Store(path).close()
    assert mode(path) == 0o600 and mode(path.parent / "archive") == 0o700


def test_a_directory_the_user_made_is_left_alone_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="aiops.fileperms"):
        Store(shared / "t.duckdb").close()
    assert mode(shared) == 0o755
    assert f"{shared} is open to other users (mode 755)" in caplog.text
    assert mode(shared / "t.duckdb") == 0o600


def test_everything_the_server_writes_under_its_data_directory_is_private(
        tmp_path: Path) -> None:
    now = time.time_ns()
    body = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
            "name": "GET /", "kind": 2, "startTimeUnixNano": str(now),
            "endTimeUnixNano": str(now + 1000)}]}]}]}
    with running_server(tmp_path, analytics=False) as (settings, _):
        r = httpx.post(f"{settings.server_url}/v1/traces", json=body, timeout=10)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 20
        while httpx.post(f"{settings.server_url}/api/v1/sql", timeout=10, json={
                "sql": "SELECT count(*) FROM spans"}).json()["rows"] != [[1]]:
            assert time.monotonic() < deadline, "the span was never stored"
            time.sleep(0.1)
        assert settings.db_path.exists()
        assert loose(settings.data_dir) == {}
    assert loose(settings.data_dir) == {}

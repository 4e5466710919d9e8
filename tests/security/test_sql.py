"""The read-only SQL API cannot change the store, read outside it or starve the server.

Attacks from issue P11 (items 1, 2, 9, and 11's writes inside a CTE), each against the real
server: a ``aiops server`` process where limits and shutdown matter, the app in a loopback
uvicorn otherwise; the allowlist (``aiops.sqlguard``) also on its own.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa
import pytest

from aiops import sqlguard
from aiops.config import Settings
from aiops.errors import QueryRejected
from aiops.store import Store
from aiops_harness.bench.common import running_server
from tests.conftest import RunningServer

SLOW = "SELECT count(*) FROM range(1000000000000) t(a) WHERE a % 7 = 3"


def _seed(store: Store, n: int = 3) -> None:
    now = time.time_ns()
    store.append("spans", pa.table({
        "trace_id": [f"{i:032x}" for i in range(1, n + 1)],
        "span_id": [f"{i:016x}" for i in range(1, n + 1)],
        "name": ["GET /"] * n, "service_name": ["svc"] * n,
        "start_time": pa.array([now] * n, pa.timestamp("ns")),
        "end_time": pa.array([now + 1000] * n, pa.timestamp("ns")),
        "duration_ns": [1000] * n,
    }))


def _sql(url: str, sql: str, timeout: float = 30, **kw: object) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/sql", json={"sql": sql, **kw}, timeout=timeout)


@pytest.fixture
def seeded(server: RunningServer) -> RunningServer:
    _seed(server.store)
    return server


WRITES = [
    "EXPLAIN ANALYZE DELETE FROM spans",
    "DELETE FROM spans",
    "UPDATE spans SET name = 'x'",
    "INSERT INTO spans SELECT * FROM spans",
    "DROP TABLE spans",
    "CREATE TABLE t AS SELECT 1",
    "CREATE TEMP TABLE t AS SELECT 1",
    "CREATE MACRO m(x) AS x",
    "CREATE TEMP MACRO m(x) AS x",
    "COPY spans TO 'x.parquet'",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.parquet'",
    "ATTACH 'other.db'",
    "CHECKPOINT",
    "VACUUM",
    "SET threads = 1",
    "SET VARIABLE x = 1",
    "LOAD parquet",
    "SELECT 1; DELETE FROM spans",
    "SELECT nextval('seq')",
]


@pytest.mark.parametrize("sql", WRITES)
def test_no_statement_changes_the_store(seeded: RunningServer, sql: str) -> None:
    r = _sql(seeded.url, sql)
    assert r.status_code == 400, r.text
    assert r.json()["error"]
    assert seeded.store.count("spans") == 3


def test_copy_into_the_archive_folder_cannot_break_the_next_start(
        seeded: RunningServer) -> None:
    archive = seeded.store.archive_dir
    assert archive is not None
    target = archive / "spans" / "evil.parquet"
    for sql in (f"COPY (SELECT 'junk') TO '{target}' (FORMAT csv)",
                f"EXPLAIN ANALYZE COPY (SELECT 'junk') TO '{target}' (FORMAT csv)"):
        assert _sql(seeded.url, sql).status_code == 400
    assert not target.exists()


# DuckDB 2 accepts INSERT, UPDATE, DELETE and COPY TO as the body of a CTE; the statement is
# still a SELECT to extract_statements, so only the allowlist's walk of the tree finds them.
# DuckDB 1.5 (the version DuckLake's extension is built for) does not parse them at all.
REFUSED = "not allowed here|A CTE needs a SELECT"
WRITES_IN_A_QUERY = [
    "WITH x AS (DELETE FROM spans RETURNING *) SELECT * FROM x",
    "WITH x AS MATERIALIZED (INSERT INTO spans SELECT * FROM spans RETURNING 1) "
    "SELECT * FROM x",
    "WITH x AS (UPDATE spans SET name = 'x' RETURNING *) SELECT count(*) FROM x",
    "WITH x AS (DELETE FROM spans) SELECT 1",
    "WITH a AS (SELECT 1), b AS (WITH c AS (DELETE FROM spans RETURNING 1) SELECT * FROM c) "
    "SELECT * FROM b",
    "SELECT (WITH x AS (DELETE FROM spans RETURNING 1) SELECT count(*) FROM x)",
    "SELECT * FROM spans WHERE name IN (WITH x AS (DELETE FROM spans RETURNING name) "
    "SELECT name FROM x)",
    "EXPLAIN WITH x AS (DELETE FROM spans RETURNING *) SELECT * FROM x",
    "SUMMARIZE WITH x AS (DELETE FROM spans RETURNING *) SELECT * FROM x",
    "WITH x AS (COPY (SELECT 1) TO 'x.csv') SELECT * FROM x",
]


@pytest.mark.parametrize("sql", WRITES_IN_A_QUERY)
def test_the_allowlist_itself_refuses_a_write_inside_a_query(sql: str) -> None:
    """Not only the READ ONLY transaction: the check refuses the statement before it runs."""
    conn = duckdb.connect()
    conn.execute("CREATE TABLE spans (name VARCHAR)")
    catalog = sqlguard.Catalog(frozenset({"spans"}), frozenset())
    with pytest.raises(QueryRejected, match=REFUSED):
        sqlguard.check(sql, lambda q: str(conn.execute(
            "SELECT json_serialize_sql(?)", [q]).fetchone()[0]), catalog)  # type: ignore[index]


@pytest.mark.parametrize("sql", WRITES_IN_A_QUERY)
def test_a_write_inside_a_query_is_refused_by_the_server(seeded: RunningServer,
                                                         sql: str) -> None:
    r = _sql(seeded.url, sql)
    assert r.status_code == 400, r.text
    assert re.search(REFUSED, r.json()["error"])
    assert seeded.store.count("spans") == 3


def test_copy_inside_a_cte_writes_no_file(seeded: RunningServer) -> None:
    """COPY ... TO in a CTE writes its file even inside a READ ONLY transaction: into the
    archive folder (the one place external access reaches) a junk file would break the
    ``<table>_all`` views at the next start."""
    archive = seeded.store.archive_dir
    assert archive is not None
    target = archive / "spans" / "evil.parquet"
    target.parent.mkdir(exist_ok=True)  # as after the first retention run
    for sql in (f"WITH x AS (COPY (SELECT 'junk') TO '{target}' (FORMAT csv)) SELECT * FROM x",
                f"COPY (SELECT 'junk') TO '{target}' (FORMAT csv)"):
        r = _sql(seeded.url, sql)
        assert r.status_code == 400, r.text
        assert not target.exists()


READS_OUTSIDE = [
    "SELECT * FROM read_blob('{db}')",
    "SELECT * FROM read_text('{db}')",
    "SELECT * FROM read_parquet('{archive}/*/*.parquet')",
    "SELECT * FROM '{archive}/spans/x.parquet'",
    "SELECT * FROM glob('{archive}/*')",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM duckdb_databases()",
    "SELECT * FROM pg_settings",
    "SELECT * FROM pg_catalog.pg_settings",
    "WITH x AS (SELECT 1) SELECT * FROM pg_settings",
    "WITH pg_settings AS (SELECT 1) SELECT * FROM pg_settings",
    "SELECT current_setting('allowed_directories')",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT * FROM pragma_database_size()",
    "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM system.main.duckdb_settings()",
    "SELECT * FROM temp.main.spans",
    "SELECT (SELECT max(value) FROM duckdb_settings()) AS v",
    "SELECT * FROM spans WHERE name IN (SELECT path FROM read_blob('{db}'))",
]


@pytest.mark.parametrize("template", READS_OUTSIDE)
def test_nothing_outside_the_stores_tables_is_readable(seeded: RunningServer,
                                                        template: str) -> None:
    archive = seeded.store.archive_dir
    sql = template.format(db=seeded.settings.db_path, archive=archive)
    r = _sql(seeded.url, sql)
    assert r.status_code == 400, r.text
    assert str(seeded.settings.data_dir) not in r.text.replace(sql, "")


USEFUL = [
    ("SELECT count(*) FROM spans", [[3]]),
    ("SELECT count(*) FROM spans_all", [[3]]),
    ("WITH s AS (SELECT name FROM spans) SELECT count(*) FROM s", [[3]]),
    ("SELECT count(*) FROM range(10)", [[10]]),
    ("SELECT sum(x) FROM unnest([1, 2, 3]) t(x)", [[6]]),
    ("SELECT count(*) FROM information_schema.tables WHERE table_name = 'spans'", [[1]]),
    ("SELECT count(*) > 0 FROM (DESCRIBE spans)", [[True]]),
    ("SELECT ?::INT + 1", [[42]]),
]


@pytest.mark.parametrize(("sql", "rows"), USEFUL)
def test_reads_of_the_stores_tables_still_work(seeded: RunningServer, sql: str,
                                               rows: list[list[object]]) -> None:
    r = _sql(seeded.url, sql, params=[41] if "?" in sql else [])
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == rows


def test_explain_and_describe_work(seeded: RunningServer) -> None:
    assert _sql(seeded.url, "EXPLAIN SELECT count(*) FROM spans").status_code == 200
    assert _sql(seeded.url, "DESCRIBE spans").status_code == 200
    assert _sql(seeded.url, "SUMMARIZE spans").status_code == 200


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[RunningServer]:
    """A server with a 1 s query limit, 2 query slots and a 1 MB result cap."""
    from aiops.server.app import create_app
    from tests.loopback import serving

    settings = Settings(data_dir=tmp_path, analytics=False, scrape_targets="",
                        retention_hours=0, sql_timeout_s=1.0, sql_max_concurrent=2,
                        sql_max_result_bytes=1_000_000)
    store = Store(settings.db_path)
    _seed(store)
    try:
        with serving(create_app(settings, store)) as url:
            yield RunningServer(url, store, settings)
    finally:
        store.close()


def test_a_runaway_query_is_interrupted_and_gives_its_slot_back(tight: RunningServer) -> None:
    started = time.monotonic()
    r = _sql(tight.url, SLOW)
    assert r.status_code == 408, r.text
    assert "interrupted" in r.json()["error"]
    assert time.monotonic() - started < 5
    # Both slots are free again.
    for _ in range(3):
        assert _sql(tight.url, "SELECT 1").status_code == 200


def test_full_query_slots_refuse_with_a_retryable_status_and_ingest_goes_on(
        tight: RunningServer) -> None:
    results: list[int] = []
    slow = [threading.Thread(target=lambda: results.append(_sql(tight.url, SLOW).status_code))
            for _ in range(2)]
    for t in slow:
        t.start()
    time.sleep(0.3)
    busy = _sql(tight.url, "SELECT 1")
    assert busy.status_code == 429 and busy.headers["retry-after"]
    # Readiness and OTLP ingest do not wait for the queries.
    started = time.monotonic()
    assert httpx.get(f"{tight.url}/readyz", timeout=5).status_code == 200
    export = httpx.post(f"{tight.url}/v1/traces", content=b"{}",
                        headers={"content-type": "application/json"}, timeout=5)
    assert export.status_code == 200
    assert time.monotonic() - started < 1.0
    for t in slow:
        t.join()
    assert results == [408, 408]


def test_a_huge_result_is_stopped_at_the_byte_cap(tight: RunningServer) -> None:
    r = _sql(tight.url, "SELECT repeat('x', 100000) FROM range(100)")
    assert r.status_code == 413, r.text
    assert "1000000 bytes" in r.json()["error"]
    assert _sql(tight.url, "SELECT repeat('x', 1000) FROM range(100)").status_code == 200


def test_a_memory_bomb_fails_alone_and_the_server_lives(tmp_path: Path) -> None:
    """An allocation DuckDB does not track (one 4 GB string) fails as that query's error
    under the server's memory cap; the server goes on answering."""
    with running_server(tmp_path, server_memory_mb=2048, analytics=False) as (settings, _):
        r = _sql(settings.server_url, "SELECT length(repeat('x', 4000000000))")
        assert r.status_code == 413 and "memory" in r.json()["error"].lower(), r.text
        assert _sql(settings.server_url, "SELECT 42").json()["rows"] == [[42]]


def test_sigterm_during_a_runaway_query_stops_the_server_promptly(tmp_path: Path) -> None:
    with running_server(tmp_path, sql_timeout_s=600, analytics=False) as (settings, pid):
        threading.Thread(target=lambda: _sql(settings.server_url, SLOW, timeout=60),
                         daemon=True).start()
        time.sleep(1.0)
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        while time.monotonic() - started < 20:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the server did not stop within 20 s of SIGTERM")

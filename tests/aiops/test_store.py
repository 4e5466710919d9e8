"""The store appends whole Arrow batches, is the only writer, and reads are read-only."""

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from aiops import semconv
from aiops.errors import QueryRejected, SchemaMismatch, StoreError
from aiops.migrations import MIGRATIONS
from aiops.store import TRACE_INDEX, Store


def spans_batch(n: int, trace_id: str = "ab" * 16) -> pa.Table:
    return pa.table({
        "trace_id": [trace_id] * n,
        "span_id": [f"{i:016x}" for i in range(n)],
        "name": [f"op-{i}" for i in range(n)],
        "start_time": pa.array([1_700_000_000_000_000_000 + i for i in range(n)],
                               pa.timestamp("ns")),
        "attributes": ['{"k": 1}'] * n,
    })


def test_append_fills_absent_nullable_columns_with_null(store: Store) -> None:
    assert store.append("spans", spans_batch(3)) == 3
    rows = store.query("SELECT span_id, parent_span_id, (attributes->>'k') FROM spans "
                       "ORDER BY span_id").rows
    assert rows == [(f"{i:016x}", None, "1") for i in range(3)]


def test_timestamps_are_nanosecond_utc(store: Store) -> None:
    store.append("spans", spans_batch(1))
    (ts,) = store.query("SELECT epoch_ns(start_time) FROM spans").rows[0]
    assert ts == 1_700_000_000_000_000_000


def test_append_many_is_one_transaction(store: Store) -> None:
    bad_logs = pa.table({"time": pa.array([None], pa.timestamp("ns")), "body": ["x"]})
    good = spans_batch(2)
    store.append("logs", bad_logs)  # time is nullable in logs
    with pytest.raises(SchemaMismatch):
        store.append_many({"spans": good, "incidents": pa.table({"summary": ["no id"]})})
    assert store.count("spans") == 0


def test_unknown_or_mistyped_columns_are_rejected(store: Store) -> None:
    with pytest.raises(SchemaMismatch, match="unknown columns"):
        store.append("spans", spans_batch(1).append_column("nope", pa.array([1])))
    with pytest.raises(SchemaMismatch, match="trace_id is required"):
        no_trace = pa.array([None], pa.string())
        store.append("spans", spans_batch(1).set_column(0, "trace_id", no_trace))
    with pytest.raises(SchemaMismatch, match="start_time"):
        store.append("spans", spans_batch(1).set_column(3, "start_time", pa.array(["soon"])))


DERIVED = {"model": pa.array(["given"]), "model_version": pa.array(["v9"]),
           "replica": pa.array(["r9"]), "http_status": pa.array([201], pa.int32()),
           "failed": pa.array([False]), "deployment": pa.array(["d9"]),
           "app": pa.array(["a9"])}


def _with_derived(trace_id: str, marked: bool, leave_out: str = "") -> pa.Table:
    t = spans_batch(1, trace_id).set_column(4, "attributes", pa.array(
        ['{"gen_ai.request.model": "m", "http.response.status_code": 503}']))
    for name, values in DERIVED.items():
        if name != leave_out:
            t = t.append_column(name, values)
    return t.replace_schema_metadata(dict([semconv.DECODED_MARK])) if marked else t


def test_derived_columns_the_decoder_marked_are_stored_as_given(store: Store) -> None:
    store.append("spans", _with_derived("aa" * 16, marked=True))
    assert store.query("SELECT model, model_version, replica, http_status, failed, deployment, "
                       "app FROM spans").rows == [("given", "v9", "r9", 201, False, "d9", "a9")]


@pytest.mark.parametrize(("marked", "leave_out"), [(False, ""), (True, "replica")],
                         ids=["unmarked", "marked but one missing"])
def test_other_derived_columns_in_a_batch_are_recomputed(store: Store, marked: bool,
                                                          leave_out: str) -> None:
    # A client's own (or rows read back from a store) say nothing the store must believe.
    store.append("spans", _with_derived("bb" * 16, marked, leave_out))
    assert store.query("SELECT model, model_version, replica, http_status, failed FROM "
                       "spans").rows == [("m", None, None, 503, True)]


@pytest.mark.parametrize("sql", [
    "INSERT INTO spans (trace_id) VALUES ('x')",
    "DROP TABLE spans",
    "COPY spans TO '/tmp/x.csv'",
    "SELECT 1; DROP TABLE spans",
    "ATTACH '/tmp/other.duckdb'",
])
def test_the_query_path_only_reads(store: Store, sql: str) -> None:
    with pytest.raises(QueryRejected):
        store.query(sql)
    assert store.count("spans") == 0


def test_queries_cannot_read_local_files(store: Store) -> None:
    with pytest.raises(StoreError, match="disabled"):
        store.query("SELECT * FROM read_text('/etc/hostname')")
    with pytest.raises(QueryRejected):
        store.query("SET enable_external_access = true")


def test_bad_sql_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="nope"):
        store.query("SELECT * FROM nope")


def test_query_limit_reports_truncation(store: Store) -> None:
    store.append("spans", spans_batch(5))
    r = store.query("SELECT span_id FROM spans", limit=3)
    assert len(r.rows) == 3 and r.truncated
    assert not store.query("SELECT span_id FROM spans", limit=5).truncated


def test_data_and_migrations_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "db" / "t.duckdb"
    s = Store(path)
    s.append("spans", spans_batch(4))
    assert s.schema_version == MIGRATIONS[-1].version
    s.close()
    s = Store(path)
    assert s.count("spans") == 4
    applied = s.query("SELECT version FROM schema_migrations").rows
    assert applied == [(m.version,) for m in MIGRATIONS]
    s.close()


def test_the_trace_index_is_created_kept_and_dropped_as_the_setting_says(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "t.duckdb"

    def indexes(s: Store) -> list[tuple[str]]:
        return s.query("SELECT index_name FROM duckdb_indexes()").rows

    s = Store(path, trace_index=True)
    s.append("spans", spans_batch(3, "cd" * 16))
    assert indexes(s) == [(TRACE_INDEX,)]
    assert s.count("spans") == 3
    assert s.query("SELECT count(*) FROM spans WHERE trace_id = ?", ["cd" * 16]).rows == [(3,)]
    s.close()
    s = Store(path)  # no say: left as it is
    assert indexes(s) == [(TRACE_INDEX,)]
    s.close()
    s = Store(path, trace_index=False)
    assert indexes(s) == [] and s.count("spans") == 3
    s.close()


def test_query_results_carry_python_values(store: Store) -> None:
    store.append("spans", spans_batch(1))
    r = store.query("SELECT start_time, name FROM spans")
    assert isinstance(r.rows[0][0], datetime)
    assert r.columns == ["start_time", "name"]


def test_a_database_from_an_older_release_migrates_forward(tmp_path: Path) -> None:
    import duckdb

    from aiops.migrations import MIGRATIONS, current_version

    path = tmp_path / "old.duckdb"
    conn = duckdb.connect(str(path))
    # What migrations 1-3 left before JSON columns became VARCHAR: JSON-typed attribute
    # columns, and an archive view depending on the table.
    current_version(conn)
    for m in MIGRATIONS[:3]:
        m.apply(conn)
    conn.execute("ALTER TABLE spans ALTER attributes TYPE JSON")
    conn.execute("CREATE VIEW spans_all AS SELECT * FROM spans")
    conn.execute("INSERT INTO spans (trace_id, span_id, name, start_time, attributes) VALUES "
                 "('t', 's', 'n', now()::TIMESTAMP_NS, '{\"k\": 1}')")
    conn.executemany("INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                     [[m.version, m.name] for m in MIGRATIONS[:3]])
    conn.close()
    store = Store(path)
    assert store.schema_version == MIGRATIONS[-1].version
    assert store.query("SELECT (attributes->>'k'), typeof(attributes) FROM spans_all").rows == [
        ("1", "VARCHAR")]
    store.close()


def test_rows_stored_before_the_identity_columns_get_them_from_their_own_attributes(
        tmp_path: Path) -> None:
    """Migration 10: a store of migration 9 (typed span columns, none on logs or metric
    points) gains deployment and app on spans and the five identity columns on logs and
    metric points, filled for the rows it already holds."""
    import duckdb

    from aiops.migrations import MIGRATIONS, current_version

    path = tmp_path / "old.duckdb"
    conn = duckdb.connect(str(path))
    current_version(conn)
    for m in MIGRATIONS[:9]:
        m.apply(conn)
    for name in ("spans", "logs", "metric_points"):  # as migration 9's release made them
        for c in ("deployment", "app") if name == "spans" else ("model", "model_version",
                                                                 "replica", "deployment", "app"):
            conn.execute(f"ALTER TABLE {name} DROP COLUMN IF EXISTS {c}")
    resource = '{"ray.serve.deployment": "Scorer", "ray.serve.app": "shop"}'
    conn.execute("INSERT INTO spans (trace_id, span_id, name, start_time, resource_attributes) "
                 f"VALUES ('t', 's', 'n', now()::TIMESTAMP_NS, '{resource}')")
    conn.execute("INSERT INTO logs (time, body, resource_attributes, attributes) VALUES "
                 f"(now()::TIMESTAMP_NS, 'b', '{resource}', '{{\"aiops.model.version\": \"v2\"}}')")
    conn.execute("INSERT INTO metric_points (time, name, attributes) VALUES (now()::TIMESTAMP_NS, "
                 "'ray_component_rss_mb', '{\"Component\": \"ray::ServeReplica:shop:Scorer\"}')")
    conn.executemany("INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                     [[m.version, m.name] for m in MIGRATIONS[:9]])
    conn.close()
    store = Store(path)
    assert store.schema_version == MIGRATIONS[-1].version
    assert store.query("SELECT deployment, app FROM spans_all").rows == [("Scorer", "shop")]
    assert store.query("SELECT model_version, deployment, app FROM logs_all").rows == [
        ("v2", "Scorer", "shop")]
    assert store.query("SELECT deployment, app FROM metric_points_all").rows == [
        ("Scorer", "shop")]
    store.close()


def test_closing_while_other_threads_read_interrupts_them_and_closes(tmp_path: Path) -> None:
    """DuckDB refuses to close a connection whose cursors are mid-call; the store waits them
    out, and readers after that get a StoreError rather than a crash at shutdown."""
    store = Store(tmp_path / "t.duckdb")
    store.append("spans", spans_batch(5_000))
    outcomes: list[str] = []
    started = threading.Barrier(4)

    def read() -> None:
        started.wait()
        try:
            while True:
                store.query("SELECT count(*) FROM spans a, spans b WHERE a.name < b.name")
        except StoreError as exc:
            outcomes.append(type(exc).__name__)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    started.wait()
    time.sleep(0.05)
    store.close()
    for t in readers:
        t.join(10)
    assert outcomes == ["StoreError"] * 3
    with pytest.raises(StoreError, match="closed"):
        store.query("SELECT 1")
    store.close()  # a second close is a no-op


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB filesystem of its own (tmpfs; needs root, as `make test` runs in CI)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_database_duckdb_invalidated_is_opened_again_with_every_acknowledged_row(
        small_disk: Path) -> None:
    """A checkpoint that cannot write (the disk is full; in the field, an allocation that
    failed under memory pressure) is a fatal error: DuckDB invalidates the database and every
    statement fails until it is opened again. A write then fails retryably (503 to an
    exporter, not 400), the store notes it is broken (``broken``: /healthz and /readyz say
    so until it is open again), opens the file again before its next statement, and every
    row acknowledged before is there (DuckDB replays its WAL)."""
    store = Store(small_disk / "t.duckdb")
    try:
        assert store.append("spans", spans_batch(500)) == 500  # acknowledged, in the WAL
        filler = (small_disk / "filler").open("wb", buffering=0)
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
        # What DuckDB does on its own once the WAL passes its threshold (or at close).
        with pytest.raises(duckdb.FatalException), store._cursor() as cur:
            cur.execute("CHECKPOINT")
        with pytest.raises(StoreError) as failed:
            store.append("spans", spans_batch(1, "cd" * 16))
        assert not isinstance(failed.value, SchemaMismatch)  # 503 to an exporter: retried
        assert store.broken is not None and "invalidated" in store.broken
        # The next statement opens the file again (replaying the WAL needs no free space).
        store.ping()
        assert store.broken is None and store.reopened == 1
        assert store.count("spans") == 500
        filler.close()
        (small_disk / "filler").unlink()
        assert store.append("spans", spans_batch(2, "ef" * 16)) == 2
        assert store.count("spans") == 502
    finally:
        store.close()

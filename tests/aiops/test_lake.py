"""Several stores on one DuckLake (a real PostgreSQL catalog, Parquet files): every row once,
whatever fails when."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from aiops.config import load_settings
from aiops.errors import AIOpsError, ConfigError, StoreError
from aiops.lake import CATALOG, LakeOptions
from aiops.pgcluster import PostgresCluster
from aiops.store import Store
from tests.lake import LakeOf, lake_of, logs, pg, require_lake, two

__all__ = ["lake_of", "pg", "two"]  # fixtures

pytestmark = pytest.mark.lake


def per_server(store: Store, table: str = "logs_all") -> dict[str, tuple[int, int]]:
    """Rows and distinct bodies per server, as ``<table>_all`` reads them."""
    rows = store.query(f"SELECT server_id, count(*), count(DISTINCT body) FROM {table} "
                       "GROUP BY 1").rows
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def in_lake(store: Store) -> dict[str, int]:
    rows = store.query(f"SELECT server_id, count(*) FROM {CATALOG}.logs GROUP BY 1").rows
    return {r[0]: int(r[1]) for r in rows}


def test_two_servers_read_each_others_rows_through_the_lake(two: tuple[Store, Store]
                                                            ) -> None:
    a, b = two
    a.append("logs", logs(100, "a"))
    b.append("logs", logs(40, "b"))
    # Not committed yet: each sees its own rows only, once.
    assert per_server(a) == {"a": (100, 100)}
    assert a.commit_lake().rows == 100 and b.commit_lake().rows == 40
    assert per_server(a) == per_server(b) == {"a": (100, 100), "b": (40, 40)}
    # Detection's tables stay each server's own.
    assert a.count("logs") == 100 and b.count("logs") == 40
    a.append("logs", logs(5, "a", start=100))
    assert per_server(a)["a"] == (105, 105)  # the 5 new ones from the outbox, the rest lake's
    assert a.commit_lake().rows == 5 and a.commit_lake().rows == 0  # nothing twice
    assert in_lake(a) == {"a": 105, "b": 40}


def test_a_commit_cut_off_after_the_lake_took_it_is_not_repeated(tmp_path: Path,
                                                                 lake_of: LakeOf) -> None:
    """The lake commits, the server dies before it empties its outbox: the restarted server
    finds the batches in the lake's record and skips them."""
    path = tmp_path / "a" / "telemetry.duckdb"
    a = Store(path, lake=lake_of("a"))
    a.append("logs", logs(50, "a"))
    assert a.lake is not None
    entered = 0

    @contextlib.contextmanager
    def dies_after_the_lake_commit() -> Iterator[None]:
        nonlocal entered
        entered += 1
        if entered == 2:  # the second lock: emptying the outbox
            raise RuntimeError("killed")
        with a._write_lock:
            yield

    with pytest.raises(RuntimeError, match="killed"):
        a.lake.commit(a._cursor, dies_after_the_lake_commit)
    a.close()
    a = Store(path, lake=lake_of("a"))
    assert a.lake_waiting() == 0 and per_server(a) == {"a": (50, 50)}
    a.append("logs", logs(7, "a", start=50))
    assert a.commit_lake().rows == 7
    assert in_lake(a) == {"a": 57} and per_server(a) == {"a": (57, 57)}
    a.close()


def test_two_servers_committing_at_the_same_moment_lose_and_repeat_nothing(
        two: tuple[Store, Store]) -> None:
    stores = dict(zip("ab", two, strict=True))
    go = threading.Barrier(2)
    errors: list[Exception] = []

    def run(name: str) -> None:
        store = stores[name]
        try:
            for i in range(15):
                store.append("logs", logs(20, name, start=20 * i))
                go.wait(timeout=30)  # both commit the same instant
                store.commit_lake()
        except (StoreError, threading.BrokenBarrierError) as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert in_lake(two[0]) == {"a": 300, "b": 300}
    assert per_server(two[1]) == {"a": (300, 300), "b": (300, 300)}


def test_an_unreachable_catalog_delays_the_lake_and_loses_nothing(
        two: tuple[Store, Store], pg: PostgresCluster) -> None:
    a, _ = two
    a.append("logs", logs(10, "a"))
    a.commit_lake()
    pg.stop()
    try:
        a.append("logs", logs(30, "a", start=10))  # ingest goes on: the rows are local
        with pytest.raises(StoreError) as failed:
            a.commit_lake()
        assert "Unable to connect to Postgres" in str(failed.value)
        assert a.lake_waiting() == 30 and a.count("logs") == 40
    finally:
        pg.start()
    assert a.commit_lake().rows == 30
    assert in_lake(a) == {"a": 40} and a.lake_waiting() == 0


def test_rows_stored_before_the_lake_was_turned_on_go_to_it(tmp_path: Path,
                                                            lake_of: LakeOf) -> None:
    path = tmp_path / "a" / "telemetry.duckdb"
    plain = Store(path)
    plain.append("logs", logs(25, "a"))
    plain.close()
    a = Store(path, lake=lake_of("a"))
    assert a.commit_lake().rows == 25 and in_lake(a) == {"a": 25}
    a.close()


def test_retention_with_a_lake_deletes_local_rows_the_lake_keeps(
        two: tuple[Store, Store]) -> None:
    a, _ = two
    a.append("logs", logs(10, "a"))
    a.commit_lake()
    assert a.archive("logs", cutoff_ns=2**62) == 10
    assert a.count("logs") == 0 and per_server(a) == {"a": (10, 10)}
    assert a.archive_dir is not None and not any(a.archive_dir.rglob("*.parquet"))


def test_upkeep_merges_the_small_files_of_many_commits(two: tuple[Store, Store],
                                                       tmp_path: Path) -> None:
    a, _ = two
    for i in range(6):
        a.append("logs", logs(50, "a", start=50 * i))
        a.commit_lake()
    files = lambda: len(list((tmp_path / "lake-data").rglob("*.parquet")))  # noqa: E731
    before = files()
    a.lake_upkeep()
    assert files() < before
    assert per_server(a) == {"a": (300, 300)}


def test_the_catalogs_password_stays_out_of_errors(tmp_path: Path) -> None:
    require_lake()
    options = LakeOptions("dbname=nowhere host=127.0.0.1 port=1 user=x password=hunter2",
                          tmp_path / "data", "a")
    with pytest.raises(StoreError) as failed:
        Store(tmp_path / "a.duckdb", lake=options)
    assert "hunter2" not in str(failed.value) and "password=***" in str(failed.value)


def test_without_the_lakes_duckdb_attaching_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_lake()
    monkeypatch.setattr(duckdb, "__version__", "9.9.9")  # as DuckDB 2.x reports itself
    with pytest.raises(StoreError, match=r"built for DuckDB 1\.5\.5, and this is DuckDB "
                                         r"9\.9\.9: .*aiops\[lake\]"):
        Store(None, lake=LakeOptions("dbname=x", tmp_path / "data", "a"))


def test_the_lake_backend_needs_its_catalog_and_data_path() -> None:
    with pytest.raises((ConfigError, AIOpsError), match="lake_catalog and lake_data_path"):
        load_settings(storage_backend="ducklake", lake_catalog="dbname=x")


def test_spans_reach_the_lake_with_the_columns_derived_at_ingest(two: tuple[Store, Store]
                                                                 ) -> None:
    a, b = two
    a.append("spans", pa.Table.from_pylist([{
        "trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "POST /v1/chat/completions",
        "start_time": 10**18, "service_name": "ingress",
        "attributes": '{"gen_ai.request.model": "m", "aiops.model.version": "v2"}'}]))
    a.commit_lake()
    assert b.query("SELECT server_id, model, model_version FROM spans_all").rows == [
        ("a", "m", "v2")]

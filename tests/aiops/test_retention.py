"""Retention moves old rows to Parquet; the `<table>_all` views still answer for them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from aiops.errors import StoreError
from aiops.retention import Retention
from aiops.store import Store

HOUR = 3600 * 10**9
NOW = 1_800_000_000 * 10**9


def spans(times: list[int]) -> pa.Table:
    return pa.table({"trace_id": ["ab" * 16] * len(times),
                     "span_id": [f"{i:016x}" for i in range(len(times))],
                     "name": ["op"] * len(times),
                     "start_time": pa.array(times, pa.timestamp("ns"))})


def test_old_rows_move_to_parquet_and_stay_queryable(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.duckdb")
    store.append("spans", spans([NOW - 30 * HOUR, NOW - 26 * HOUR, NOW - HOUR]))
    moved = Retention(store, hours=24, interval_s=60, clock=lambda: NOW).run_once()
    assert moved["spans"] == 2 and moved["logs"] == 0
    assert store.count("spans") == 1
    assert store.query("SELECT count(*) FROM spans_all").rows == [(3,)]
    assert len(list((tmp_path / "archive" / "spans").glob("*.parquet"))) == 1
    store.close()
    reopened = Store(tmp_path / "t.duckdb")  # the views come back with the store
    assert reopened.query("SELECT count(*) FROM spans_all WHERE start_time < "
                          "make_timestamp_ns(?)", [NOW - 24 * HOUR]).rows == [(2,)]
    reopened.close()


def test_a_file_from_a_run_that_never_committed_is_removed(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.duckdb")
    stray = tmp_path / "archive" / "spans" / "spans-until-1.parquet"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"PAR1 half written")
    store.append("spans", spans([NOW - 30 * HOUR]))
    assert store.archive("spans", NOW - 24 * HOUR) == 1
    assert not stray.exists()
    assert store.query("SELECT count(*) FROM spans_all").rows == [(1,)]
    store.close()


def test_the_archive_is_the_only_place_queries_may_read_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.duckdb")
    store.append("spans", spans([NOW - 30 * HOUR]))
    store.archive("spans", NOW)
    archived = tmp_path / "archive" / "spans"
    assert store.query(f"SELECT count(*) FROM read_parquet('{archived}/*.parquet')").rows \
        == [(1,)]
    with pytest.raises(StoreError, match="disabled"):
        store.query("SELECT * FROM read_text('/etc/hostname')")
    store.close()


def test_rows_archived_before_the_typed_span_columns_existed_get_them_derived(
        tmp_path: Path) -> None:
    """An archive file from before migration 9 has no ``model``/``failed``/... columns;
    beside newer files the union fills them with NULL. The view derives them from the row."""
    import pyarrow.parquet as pq

    from aiops.schema import SPANS

    def failing(times: list[int], model: str) -> pa.Table:
        t = spans(times)
        return t.append_column("attributes", pa.array(
            [f'{{"gen_ai.request.model": "{model}", "http.response.status_code": 503}}'] *
            len(times))).append_column("status_code", pa.array(["unset"] * len(times)))

    store = Store(tmp_path / "t.duckdb")
    store.append("spans", failing([NOW - 50 * HOUR], "old"))
    assert store.archive("spans", NOW - 48 * HOUR) == 1
    [old] = (tmp_path / "archive" / "spans").glob("*.parquet")
    derived = [d.name for d in SPANS.derived]
    pq.write_table(pq.read_table(old).drop_columns(derived), old)  # as an old release wrote it
    store.close()

    store = Store(tmp_path / "t.duckdb")
    query = "SELECT model, http_status, failed FROM spans_all ORDER BY start_time"
    assert store.query(query).rows == [("old", 503, True)]
    store.append("spans", failing([NOW - 30 * HOUR], "new"))
    assert store.archive("spans", NOW - 24 * HOUR) == 1  # a file with the columns beside it
    assert store.query(query).rows == [("old", 503, True), ("new", 503, True)]
    store.close()

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

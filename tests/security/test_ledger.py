"""Every column of a hash-chained row is covered: changing one is found, with its seq and name."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from aiops.ledger import verify_table
from aiops.store import Store

T = 1_700_000_000_000_000_000


def ledger_entry(i: int) -> dict[str, object]:
    return {"time": T + i, "actor": "policy", "action_id": f"act-{i:012x}", "status": "pending",
            "outcome": {"rule": "scale"}}


def provenance_entry(i: int) -> dict[str, object]:
    return {"time": T + i, "trace_id": f"{i:032x}", "inference_id": f"inf-{i}", "model": "m",
            "version": "v1", "artifact_digest": "sha256:aa", "input_hash": f"sha256:{i:064x}",
            "hardware": "sha256:bb"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    store = Store(path)
    store.append_many({}, {"ledger": [ledger_entry(i) for i in range(1, 4)],
                           "provenance": [provenance_entry(i) for i in range(1, 4)]})
    store.append_many({}, {"ledger": [ledger_entry(i) for i in range(4, 6)],
                           "provenance": [provenance_entry(i) for i in range(4, 6)]})
    store.close()
    return path


def tamper(path: Path, table: str, *statements: str) -> dict[str, object]:
    conn = duckdb.connect(str(path))
    for sql in statements:
        conn.execute(sql)
    conn.close()
    store = Store(path)
    try:
        return verify_table(store, table)
    finally:
        store.close()


@pytest.mark.parametrize("table", ["ledger", "provenance"])
def test_untouched_chains_still_verify(db: Path, table: str) -> None:
    assert tamper(db, table) == {"table": table, "entries": 5, "anchored": True, "ok": True,
                                 "problems": []}


def test_a_changed_actor_is_found(db: Path) -> None:
    report = tamper(db, "ledger", "UPDATE ledger SET actor = 'mallory' WHERE seq = 2")
    assert report["problems"] == ["seq 2: modified: its actor column does not match its entry"]


def test_a_changed_ledger_time_and_action_id_are_found(db: Path) -> None:
    report = tamper(db, "ledger",
                    "UPDATE ledger SET time = time + INTERVAL 1 SECOND WHERE seq = 1",
                    "UPDATE ledger SET action_id = NULL WHERE seq = 5")
    assert report["problems"] == ["seq 1: modified: its time column does not match its entry",
                                  "seq 5: modified: its action_id column does not match its "
                                  "entry"]


@pytest.mark.parametrize(("sql", "column"), [
    ("UPDATE provenance SET model = 'other' WHERE seq = 3", "model"),
    ("UPDATE provenance SET trace_id = NULL WHERE seq = 3", "trace_id"),
    ("UPDATE provenance SET hardware = 'sha256:cc' WHERE seq = 3", "hardware"),
    # One nanosecond: the check compares integer ns, not microsecond datetimes.
    ("UPDATE provenance SET time = make_timestamp_ns(epoch_ns(time) + 1) WHERE seq = 3", "time"),
])
def test_a_changed_provenance_column_is_found(db: Path, sql: str, column: str) -> None:
    report = tamper(db, "provenance", sql)
    assert report["problems"] == [f"seq 3: modified: its {column} column does not match its "
                                  "entry"]

"""The provenance chain detects every kind of tampering, and says where."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from aiops.ledger import verify_table
from aiops.store import Store


def entry(i: int) -> dict[str, object]:
    return {"time": 1_700_000_000_000_000_000 + i, "trace_id": f"{i:032x}",
            "inference_id": f"inf-{i}", "model": "m", "version": "v1",
            "artifact_digest": "sha256:aa", "input_hash": f"sha256:{i:064x}",
            "hardware": "sha256:bb"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    store = Store(path)
    store.append_many({}, {"provenance": [entry(i) for i in range(1, 4)]})
    store.append_many({}, {"provenance": [entry(i) for i in range(4, 8)]})  # chain continues
    store.close()
    return path


def tamper(path: Path, *statements: str) -> dict[str, object]:
    conn = duckdb.connect(str(path))
    for sql in statements:
        conn.execute(sql)
    conn.close()
    store = Store(path)
    try:
        return verify_table(store, "provenance")
    finally:
        store.close()


def test_an_intact_chain_verifies(db: Path) -> None:
    report = tamper(db)
    assert report == {"table": "provenance", "entries": 7, "anchored": True, "ok": True,
                      "problems": [], "witness": None}


def test_a_modified_entry_is_found(db: Path) -> None:
    report = tamper(db, "UPDATE provenance SET entry = replace(entry, 'inf-3', 'inf-X') "
                        "WHERE seq = 3")
    assert report["problems"] == ["seq 3: modified: its content does not match its hash"]


def test_a_deleted_entry_is_found(db: Path) -> None:
    report = tamper(db, "DELETE FROM provenance WHERE seq = 4")
    assert "seq 4: missing: entries 4..4 are gone" in report["problems"]


def test_an_inserted_entry_is_found(db: Path) -> None:
    report = tamper(db, "INSERT INTO provenance SELECT * FROM provenance WHERE seq = 2")
    assert any("inserted" in p for p in report["problems"]), report


def test_reordered_entries_are_found(db: Path) -> None:
    report = tamper(db, "UPDATE provenance SET seq = 99 WHERE seq = 5",
                    "UPDATE provenance SET seq = 5 WHERE seq = 6",
                    "UPDATE provenance SET seq = 6 WHERE seq = 99")
    assert not report["ok"] and any(p.startswith("seq 5:") for p in report["problems"])


def test_a_cut_off_tail_is_found_through_the_anchor(db: Path) -> None:
    report = tamper(db, "DELETE FROM provenance WHERE seq >= 6")
    assert report["problems"] == [
        "seq 6: truncated: the anchor records 7 entries, the table ends at 5"]


def test_a_forged_chain_rewritten_end_to_end_still_fails_the_anchor(db: Path) -> None:
    # Rewriting every hash consistently is possible without the anchor; with it, the head
    # the writer recorded no longer matches.
    from aiops.ledger import GENESIS, link

    conn = duckdb.connect(str(db))
    rows = conn.execute("SELECT seq, entry FROM provenance ORDER BY seq").fetchall()
    prev = GENESIS
    for seq, body in rows:
        body = body.replace("inf-1", "inf-Z") if seq == 1 else body
        h = link(prev, seq, body)
        conn.execute("UPDATE provenance SET entry = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                     [body, prev, h, seq])
        prev = h
    # A consistent forger changes the column the entry fills too.
    conn.execute("UPDATE provenance SET inference_id = 'inf-Z' WHERE seq = 1")
    conn.close()
    report = tamper(db)
    assert report["problems"] == ["seq 7: modified: the last entry differs from the anchored head"]


def test_a_witness_reading_stops_where_the_file_ended_when_it_began(tmp_path: Path) -> None:
    """Verification takes the witness's size before it reads the rows: a head committed and
    witnessed meanwhile is not compared with rows read before it existed."""
    from aiops.witness import Witness

    witness = Witness(tmp_path / "w.jsonl")
    witness.append("provenance", 3, "a" * 64)
    reading = witness.reading("provenance")
    witness.append("provenance", 5, "b" * 64)
    with witness.path.open("a") as f:
        f.write('{"table": "provenance", "seq": 6')  # a write in flight
    assert [(seq, h) for seq, h, _ in reading] == [(3, "a" * 64)]
    later = witness.reading("provenance")
    assert [seq for seq, _, _ in later] == [3, 5] and later.problems == []
    assert (later.heads, later.last_seq) == (2, 5)

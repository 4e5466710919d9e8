"""Every column of a hash-chained row is covered: changing one is found, with its seq and name.
A rewrite by someone who can write the data directory (entry changed, the chain after it and
the anchor recomputed) is found when a ledger witness is configured (issue P11, item 11)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import httpx
import pytest
from typer.testing import CliRunner

from aiops.cli import app
from aiops.config import Settings
from aiops.ledger import GENESIS, Anchor, canonical, entry_columns, link, verify_table
from aiops.store import Store

if TYPE_CHECKING:
    from aiops.witness import Witness

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
                                 "problems": [], "witness": None}


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


# --- a rewrite with the chain and the anchor recomputed -------------------------------------


def make_witness(path: Path) -> Witness:
    from aiops.witness import Witness  # here: the tests above predate it

    return Witness(path)


@pytest.fixture
def witnessed(tmp_path: Path) -> tuple[Path, Witness]:
    """A ledger of 5 entries, written in two commits (heads 3 and 5) with a witness outside
    the data directory."""
    path = tmp_path / "data" / "t.duckdb"
    witness = make_witness(tmp_path / "witness" / "ledger.jsonl")
    witness.path.parent.mkdir()
    store = Store(path, witness=witness)
    store.append_many({}, {"ledger": [ledger_entry(i) for i in range(1, 4)]})
    store.append_many({}, {"ledger": [ledger_entry(i) for i in range(4, 6)]})
    store.close()
    return path, witness


def rewrite(path: Path, seq: int, **changes: object) -> None:
    """What an attacker who can write the data directory does: change entry ``seq`` (its
    columns too), recompute every hash after it and write the anchor to match."""
    conn = duckdb.connect(str(path))
    rows = conn.execute("SELECT seq, entry FROM ledger ORDER BY seq").fetchall()
    prev = GENESIS
    for s, body in rows:
        if s == seq:
            entry = {**json.loads(body), **changes}
            body = canonical(entry)
            for column in {c.name for c in entry_columns("ledger")} & changes.keys():
                conn.execute(f"UPDATE ledger SET {column} = ? WHERE seq = ?",
                             [entry[column], s])
        digest = link(prev, s, body)
        conn.execute("UPDATE ledger SET entry = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                     [body, prev, digest, s])
        prev = digest
    conn.close()
    Anchor(path.with_name(f"{path.stem}.ledger.head")).write(rows[-1][0], prev)


def verify(path: Path, witness: Witness | None) -> dict[str, Any]:
    store = Store(path, witness=witness)
    try:
        return verify_table(store, "ledger")
    finally:
        store.close()


def test_without_a_witness_a_recomputed_rewrite_verifies(witnessed: tuple[Path, Witness]
                                                         ) -> None:
    """The limit docs/security.md states: the anchor lives in the data directory too."""
    path, _ = witnessed
    rewrite(path, 2, actor="mallory")
    assert verify(path, None)["ok"] is True


def test_a_recomputed_rewrite_fails_against_the_witness(witnessed: tuple[Path, Witness]
                                                       ) -> None:
    path, witness = witnessed
    assert verify(path, witness)["witness"] == {"heads": 2, "last_seq": 5}
    rewrite(path, 2, actor="mallory")
    report = verify(path, witness)
    assert report["ok"] is False
    problems = report["problems"]
    assert len(problems) == 2, problems
    assert problems[0].startswith("seq 3: modified: the chain up to here differs from the "
                                  "head witnessed at ")
    assert problems[1] == "seq 5: modified: 1 later witnessed heads differ too"


def test_a_forged_witness_line_does_not_help(witnessed: tuple[Path, Witness]) -> None:
    """The process can still append to the witness: a line for the forged head shows as a
    second head for a seq already witnessed, and the old heads still disagree."""
    path, witness = witnessed
    rewrite(path, 4, outcome={"rule": "scale", "approved_by": "mallory"})
    conn = duckdb.connect(str(path))
    forged = conn.execute("SELECT hash FROM ledger WHERE seq = 5").fetchone()
    conn.close()
    assert forged is not None
    witness.append("ledger", 5, forged[0])
    report = verify(path, witness)
    assert report["ok"] is False
    assert any("line 3 records seq 5 of ledger after seq 5 with another hash" in p
               for p in report["problems"]), report


def test_a_cut_off_tail_with_a_rewritten_anchor_fails_against_the_witness(
        witnessed: tuple[Path, Witness]) -> None:
    path, witness = witnessed
    conn = duckdb.connect(str(path))
    conn.execute("DELETE FROM ledger WHERE seq > 3")
    (head,) = conn.execute("SELECT hash FROM ledger WHERE seq = 3").fetchone() or ("",)
    conn.close()
    Anchor(path.with_name(f"{path.stem}.ledger.head")).write(3, head)
    assert verify(path, None)["ok"] is True
    report = verify(path, witness)
    (problem,) = report["problems"]
    assert problem.startswith("seq 4: truncated: the witness recorded seq 5 at ")
    assert problem.endswith(", the table ends at 3")


@pytest.mark.parametrize(("damage", "expected"), [
    ("garbage", "witness: line 3 is not a witness record"),
    ("directory", "witness: cannot be read"),
    ("missing", "witness: the file does not exist, yet the table has 5 entries"),
    ("emptied", "witness: it holds no head of ledger, yet the table has 5 entries"),
])
def test_a_witness_that_cannot_be_read_or_is_damaged_fails_verification(
        witnessed: tuple[Path, Witness], damage: str, expected: str) -> None:
    path, witness = witnessed
    if damage == "garbage":
        with witness.path.open("a") as f:
            f.write("not json\n")
    elif damage == "emptied":
        witness.path.write_bytes(b"")
    else:
        witness.path.unlink()
        if damage == "directory":
            witness.path.mkdir()
    report = verify(path, witness)
    assert report["ok"] is False
    assert any(p.startswith(expected) for p in report["problems"]), report


def test_a_witness_turned_on_for_an_existing_ledger_protects_it_from_then_on(
        db: Path, tmp_path: Path) -> None:
    witness = make_witness(tmp_path / "late-witness.jsonl")
    store = Store(db, witness=witness)
    store.witness_heads()
    store.witness_heads()  # once per table, not once per start
    store.close()
    assert len(witness.path.read_text().splitlines()) == 2  # ledger and provenance
    rewrite(db, 1, actor="mallory")
    report = verify(db, witness)
    assert report["ok"] is False
    assert report["problems"][0].startswith(
        "seq 5: modified: the chain up to here differs from the head witnessed")


def test_a_witness_that_cannot_be_written_does_not_lose_the_entries(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    witness = make_witness(tmp_path / "no-such-dir" / "w.jsonl")
    store = Store(tmp_path / "data" / "t.duckdb", witness=witness)
    try:
        with caplog.at_level(logging.ERROR, logger="aiops.store"):
            store.append_many({}, {"ledger": [ledger_entry(1)]})
        assert store.count("ledger") == 1
        assert "cannot append the head of ledger (seq 1) to the ledger witness" in caplog.text
    finally:
        store.close()


def test_the_witness_must_live_outside_the_data_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be outside data_dir"):
        Settings(data_dir=tmp_path, ledger_witness_file=tmp_path / "w.jsonl")


def test_ledger_verify_reports_the_witness_offline_and_over_http(
        witnessed: tuple[Path, Witness]) -> None:
    from aiops.server.app import create_app
    from tests.loopback import serving

    path, witness = witnessed
    env = {"AIOPS_DATA_DIR": str(path.parent), "AIOPS_DB_FILE": path.name,
           "AIOPS_LEDGER_WITNESS_FILE": str(witness.path)}
    ok = CliRunner().invoke(app, ["ledger", "verify", "--offline", "--table", "ledger"],
                            env=env)
    assert ok.exit_code == 0
    assert "2 witnessed heads match, the last at seq 5" in " ".join(ok.output.split())
    rewrite(path, 2, actor="mallory")
    bad = CliRunner().invoke(app, ["ledger", "verify", "--offline", "--table", "ledger"],
                             env=env)
    assert bad.exit_code == 1
    assert "differs from the head witnessed" in " ".join(bad.output.split()), bad.output
    settings = Settings(data_dir=path.parent, db_file=path.name, analytics=False,
                        scrape_targets="", retention_hours=0)
    store = Store(path, witness=witness)
    try:
        with serving(create_app(settings, store)) as url:
            report = httpx.get(f"{url}/api/v1/ledger/ledger/verify", timeout=30).json()
    finally:
        store.close()
    assert report["ok"] is False and report["witness"] == {"heads": 2, "last_seq": 5}
    assert str(witness.path) not in json.dumps(report)


def test_verifications_at_once_share_one_and_the_cli_sends_its_token(
        witnessed: tuple[Path, Witness], tmp_path: Path) -> None:
    """Forty viewers verifying at once get one verification's report (45 at once ran the
    server out of memory), and `aiops ledger verify` against a server that requires tokens
    sends the one it has (AIOPS_TOKEN)."""
    import concurrent.futures

    from aiops.auth import TOKENS_FILE, Role, TokenStore
    from aiops.server.app import create_app
    from aiops_harness.bench.common import free_port
    from tests.loopback import serving

    path, witness = witnessed
    settings = Settings(data_dir=path.parent, db_file=path.name, analytics=False,
                        scrape_targets="", retention_hours=0, anonymous_on_loopback=False,
                        server_port=free_port())
    viewer = TokenStore(settings.data_dir / TOKENS_FILE).add("auditor", Role.VIEWER)
    store = Store(path, witness=witness)
    try:
        with serving(create_app(settings, store), settings.server_port, settings) as url:
            def verify_once(_: int) -> tuple[int, Any]:
                r = httpx.get(f"{url}/api/v1/ledger/ledger/verify", timeout=60,
                              headers={"authorization": f"Bearer {viewer}"})
                return r.status_code, r.json()

            with concurrent.futures.ThreadPoolExecutor(40) as pool:
                answers = list(pool.map(verify_once, range(40)))
            assert {code for code, _ in answers} == {200}
            assert all(report == answers[0][1] for _, report in answers)
            assert answers[0][1]["ok"] is True and answers[0][1]["entries"] == 5
            env = {"AIOPS_DATA_DIR": str(tmp_path / "elsewhere"),
                   "AIOPS_SERVER_PORT": str(settings.server_port), "AIOPS_TOKEN": viewer}
            online = CliRunner().invoke(app, ["ledger", "verify", "--table", "ledger"],
                                        env=env)
            assert online.exit_code == 0, online.output
            assert "OK: 5 entries in ledger" in online.output
    finally:
        store.close()

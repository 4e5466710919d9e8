"""Hash chains for the tamper-evident tables (``provenance``; the actions ``ledger`` later).

Entry ``n`` stores ``hash_n = sha256(prev_hash || seq || canonical_json(entry))`` with
``prev_hash = hash_{n-1}`` (64 zeros for the first). The writer also keeps the chain's head
(seq and hash) in an anchor file outside the database, so that cutting entries off the end is
detected too. ``verify_chain`` says what is wrong and where: a modified entry (its hash no
longer matches), a deleted, inserted or reordered one (the sequence or the links break), a
truncated tail (the anchor is ahead of the table).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENESIS", "PROVENANCE_EVENT", "Anchor", "ChainProblem", "canonical", "link",
           "verify_chain", "verify_table"]

GENESIS = "0" * 64
# Event name of the OTLP log records that carry provenance entries to the server.
PROVENANCE_EVENT = "aiops.provenance"


def canonical(entry: Mapping[str, Any]) -> str:
    """The one byte-exact JSON spelling of an entry that its hash covers."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def link(prev_hash: str, seq: int, entry_json: str) -> str:
    return hashlib.sha256(f"{prev_hash}\n{seq}\n{entry_json}".encode()).hexdigest()


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    kind: str  # modified, missing, inserted, reordered, truncated
    detail: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class Anchor:
    """The head of a chain, written beside the database after every commit."""

    path: Path

    def write(self, seq: int, hash_: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": seq, "hash": hash_}))
        tmp.replace(self.path)

    def read(self) -> tuple[int, str] | None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return int(doc["seq"]), str(doc["hash"])


def verify_chain(rows: Iterable[tuple[int, str, str, str]],
                 anchor: tuple[int, str] | None = None) -> list[ChainProblem]:
    """Check rows ``(seq, entry_json, prev_hash, hash)`` in stored order (by seq)."""
    problems: list[ChainProblem] = []
    expected_seq, prev = 1, GENESIS
    last_seq, last_hash = 0, GENESIS
    for seq, entry_json, prev_hash, hash_ in rows:
        if seq != expected_seq:
            if seq > expected_seq:
                problems.append(ChainProblem(expected_seq, "missing",
                                             f"entries {expected_seq}..{seq - 1} are gone"))
            else:
                problems.append(ChainProblem(seq, "inserted",
                                             f"seq {seq} appears again after {expected_seq - 1}"))
        if prev_hash != prev:
            problems.append(ChainProblem(seq, "reordered" if seq == expected_seq else "broken",
                                         "its prev_hash does not link to the entry before it"))
        if link(prev_hash, seq, entry_json) != hash_:
            problems.append(ChainProblem(seq, "modified",
                                         "its content does not match its hash"))
        expected_seq, prev = seq + 1, hash_
        last_seq, last_hash = seq, hash_
    if anchor is not None:
        head_seq, head_hash = anchor
        if head_seq > last_seq:
            problems.append(ChainProblem(last_seq + 1, "truncated",
                                         f"the anchor records {head_seq} entries, the table "
                                         f"ends at {last_seq}"))
        elif head_seq == last_seq and head_hash != last_hash:
            problems.append(ChainProblem(last_seq, "modified",
                                         "the last entry differs from the anchored head"))
    return problems


CHAINED_TABLES = ("provenance", "ledger")


def verify_table(store: Any, table_name: str) -> dict[str, Any]:
    """Verify a hash-chained table of a ``Store`` against its anchor; a report dict."""
    if table_name not in CHAINED_TABLES:
        raise ValueError(f"{table_name!r} is not a hash-chained table ({CHAINED_TABLES})")
    rows = store.iter_rows(f"SELECT seq, entry, prev_hash, hash FROM {table_name} ORDER BY seq")
    anchor = store.anchor(table_name)
    head = anchor.read() if anchor is not None else None
    count = 0

    def counted() -> Iterable[tuple[int, str, str, str]]:
        nonlocal count
        for r in rows:
            count += 1
            yield r

    problems = verify_chain(counted(), head)
    return {"table": table_name, "entries": count, "anchored": head is not None,
            "ok": not problems, "problems": [str(p) for p in problems]}

"""Hash chains for the tamper-evident tables (``provenance`` and the actions ``ledger``).

Entry ``n`` stores ``hash_n = sha256(prev_hash || seq || canonical_json(entry))`` with
``prev_hash = hash_{n-1}`` (64 zeros for the first). The writer also keeps the chain's head
(seq and hash) in an anchor file outside the database, so that cutting entries off the end is
detected too. ``verify_chain`` says what is wrong and where: a modified entry (its hash no
longer matches), a modified column (every column other than seq, entry, prev_hash and hash is
filled from the entry's key of the same name, so each must still equal what the hashed entry
says), a deleted, inserted or reordered one (the sequence or the links break), a truncated tail
(the anchor is ahead of the table).

The anchor lives beside the database, so whoever can write the data directory can rewrite an
entry, recompute the chain and the anchor, and this file alone would call it intact. With a
witness (``aiops.witness``, setting ``ledger_witness_file``) every head the server wrote is
also on append-only storage elsewhere, and ``verify_table`` checks the chain against each.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from aiops.schema import Column, Kind, Table, table

__all__ = ["CHAIN_COLUMNS", "GENESIS", "PROVENANCE_EVENT", "Anchor", "ChainProblem",
           "canonical", "entry_columns", "link", "link_entries", "verify_chain",
           "verify_table"]

GENESIS = "0" * 64
# The columns of a chained table that the chain itself consists of; every other column is
# filled from the entry's key of the same name (``aiops.store._link_entries``).
CHAIN_COLUMNS = ("seq", "entry", "prev_hash", "hash")
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
        """Replace the anchor (written whole to a temporary file first); 0600 from the start."""
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # a leftover temporary file keeps its old mode otherwise
            os.write(fd, json.dumps({"seq": seq, "hash": hash_}).encode())
        finally:
            os.close(fd)
        tmp.replace(self.path)

    def read(self) -> tuple[int, str] | None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return int(doc["seq"]), str(doc["hash"])


def entry_columns(table_name: str) -> list[Column]:
    """The columns of a chained table that repeat a key of the entry (all but the chain's)."""
    return [c for c in table(table_name).columns if c.name not in CHAIN_COLUMNS]


_UNREPRESENTABLE = object()
# Entry values that a column of this kind stores unchanged (no Arrow conversion needed).
_PLAIN: dict[Kind, tuple[type, ...]] = {
    Kind.VARCHAR: (str,), Kind.JSON: (str,), Kind.BIGINT: (int,), Kind.INTEGER: (int,),
    Kind.TIMESTAMP: (int,), Kind.DOUBLE: (float,), Kind.BOOLEAN: (bool,)}


def _stored(column: Column, value: Any) -> Any:
    """What the column holds for an entry value, as ``verify_table`` reads it back
    (timestamps as integer ns): the writer's Arrow conversion of the value."""
    if value is None or (type(value) in _PLAIN.get(column.kind, ())):
        return value
    try:
        scalar = pa.scalar(value, type=column.kind.arrow)
        if column.kind is Kind.TIMESTAMP:
            scalar = scalar.cast(pa.int64())
        return scalar.as_py()
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return _UNREPRESENTABLE


def _column_problems(seq: int, entry_json: str, columns: Sequence[Column],
                     values: Sequence[Any]) -> list[ChainProblem]:
    try:
        entry = json.loads(entry_json)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        return [ChainProblem(seq, "modified", "its entry is not a JSON object")]
    return [ChainProblem(seq, "modified", f"its {c.name} column does not match its entry")
            for c, value in zip(columns, values, strict=True)
            if value != _stored(c, entry.get(c.name))]


def verify_chain(rows: Iterable[Sequence[Any]], anchor: tuple[int, str] | None = None,
                 columns: Sequence[Column] = (),
                 witnessed: Iterable[tuple[int, str, str]] = ()) -> list[ChainProblem]:
    """Check rows ``(seq, entry_json, prev_hash, hash, *values)`` in stored order (by seq),
    where ``values`` are those of ``columns`` (timestamps as integer ns), each of which must
    equal the entry's key of the same name; and against ``witnessed`` heads ``(seq, hash,
    time)`` in rising seq: the entry at each witnessed seq must have that hash."""
    problems: list[ChainProblem] = []
    expected_seq, prev = 1, GENESIS
    last_seq, last_hash = 0, GENESIS
    heads = iter(witnessed)
    head = next(heads, None)
    differing: list[int] = []
    for row in rows:
        seq, entry_json, prev_hash, hash_ = row[:4]
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
        elif columns:
            # Only an entry its hash vouches for can vouch for the columns.
            problems.extend(_column_problems(seq, entry_json, columns, row[4:]))
        while head is not None and head[0] <= seq:
            # A witnessed seq below this row's is a gap, reported above as missing.
            if head[0] == seq and head[1] != hash_:
                if not differing:
                    problems.append(ChainProblem(
                        seq, "modified", f"the chain up to here differs from the head "
                        f"witnessed at {head[2]}: an entry at or before it was rewritten and "
                        "the chain recomputed"))
                differing.append(seq)
            head = next(heads, None)
        expected_seq, prev = seq + 1, hash_
        last_seq, last_hash = seq, hash_
    if len(differing) > 1:
        problems.append(ChainProblem(differing[-1], "modified",
                                     f"{len(differing) - 1} later witnessed heads differ too"))
    if head is not None:
        *_, head = (head, *heads)
        problems.append(ChainProblem(last_seq + 1, "truncated",
                                     f"the witness recorded seq {head[0]} at {head[2]}, the "
                                     f"table ends at {last_seq}"))
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
    """Verify a hash-chained table of a ``Store`` against its anchor and, when the store has
    one, its witness; a report dict (``witness``: None when there is none, else how many
    heads it holds for the table and the last one's seq)."""
    if table_name not in CHAINED_TABLES:
        raise ValueError(f"{table_name!r} is not a hash-chained table ({CHAINED_TABLES})")
    columns = entry_columns(table_name)
    selected = ", ".join([*CHAIN_COLUMNS, *(f"epoch_ns({c.name})" if c.kind is Kind.TIMESTAMP
                                            else c.name for c in columns)])
    rows = store.iter_rows(f"SELECT {selected} FROM {table_name} ORDER BY seq")
    anchor = store.anchor(table_name)
    head = anchor.read() if anchor is not None else None
    # Before the rows are read: a head witnessed later may be of a row committed later.
    witness = getattr(store, "witness", None)
    reading = witness.reading(table_name) if witness is not None else None
    count = 0

    def counted() -> Iterable[Sequence[Any]]:
        nonlocal count
        for r in rows:
            count += 1
            yield r

    problems = [str(p) for p in verify_chain(counted(), head, columns,
                                             reading if reading is not None else ())]
    if reading is None:
        return {"table": table_name, "entries": count, "anchored": head is not None,
                "ok": not problems, "problems": problems, "witness": None}
    problems += [f"witness: {p}" for p in reading.problems]
    if reading.missing and count:
        problems.append(f"witness: the file does not exist, yet the table has {count} "
                        "entries (moved, deleted, or configured after they were written "
                        "and the server not started since)")
    elif count and not reading.heads and not reading.problems:
        problems.append(f"witness: it holds no head of {table_name}, yet the table has "
                        f"{count} entries (emptied or cut down, or configured after they "
                        "were written and the server not started since)")
    return {"table": table_name, "entries": count, "anchored": head is not None,
            "ok": not problems, "problems": problems,
            "witness": {"heads": reading.heads, "last_seq": reading.last_seq}}


def link_entries(t: Table, entries: list[dict[str, Any]], seq: int, prev: str
                  ) -> tuple[pa.Table, tuple[int, str]]:
    """Rows for ``entries`` chained after (seq, prev). Each entry's own keys fill the
    table's columns; the whole entry is the canonical JSON the hash covers. No column holds
    anything but the entry's key of its name (or the chain's own seq, entry, prev_hash,
    hash): that is how ``aiops.ledger.verify_chain`` covers every column with the hash."""
    rows = []
    for entry in entries:
        seq += 1
        body = canonical(entry)
        digest = link(prev, seq, body)
        rows.append({**{c: entry.get(c) for c in t.column_names}, "seq": seq, "entry": body,
                     "prev_hash": prev, "hash": digest})
        prev = digest
    columns = {c: [r[c] for r in rows] for c in t.column_names}
    return pa.Table.from_pydict(columns, schema=t.arrow_schema), (seq, prev)

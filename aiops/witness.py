"""The ledger's heads, witnessed outside the data directory (setting ``ledger_witness_file``).

The anchor file beside the database catches a cut-off tail, but whoever can write the data
directory can rewrite an entry, recompute the chain after it and write a matching anchor. The
witness closes that: after every commit of a hash-chained table the store also appends the new
head ``(table, seq, hash, time)`` as one JSON line to a file on storage the aiops process can
only append to (``chattr +a`` set by root, or a file a log shipper of another user forwards to
an append-only store; docs/security.md). One head pins every entry up to it, since each hash
covers the one before; ``aiops.ledger.verify_table`` checks the chain against every witnessed
head, so a rewritten entry is found unless every head witnessed after it is rewritten too,
which append-only storage does not allow. Lines only get added: a forged line for a seq
already witnessed shows as two heads for one seq.

One witness file per database. Writes are opened with ``O_APPEND`` (the only way a ``chattr +a``
file can be written) and each record is one ``write``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["Witness", "WitnessReading", "from_settings"]

_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Witness:
    """An append-only file of chain heads, one JSON line each."""

    path: Path
    db: str = ""  # which database the heads are of, for whoever reads the sink elsewhere

    def append(self, table: str, seq: int, hash_: str) -> None:
        """Append one head; raises OSError if the file cannot be written."""
        record = {"table": table, "seq": seq, "hash": hash_, "db": self.db,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def reading(self, table: str) -> WitnessReading:
        """The heads of ``table`` as the file is now: lines appended from here on are not
        read, so a verification never sees a head newer than the rows it reads after this."""
        try:
            size: int | None = self.path.stat().st_size
            error = None
        except FileNotFoundError:
            size, error = None, None
        except OSError as exc:
            size, error = None, f"cannot be read ({exc.strerror or exc})"
        return WitnessReading(self.path, table, size, [error] if error else [])

    def last_seq(self, table: str) -> int | None:
        """The last seq witnessed for ``table``, or None if none is; OSError if unreadable."""
        reading = self.reading(table)
        if reading.problems:
            raise OSError(f"witness {self.path}: {reading.problems[0]}")
        last = None
        for seq, _, _ in reading:
            last = seq
        return last


@dataclass
class WitnessReading:
    """Iterates ``(seq, hash, time)`` of one table's heads in file order, each seq higher
    than the last; what is wrong with the file collects in ``problems``."""

    path: Path
    table: str
    size: int | None  # None: no such file (yet)
    problems: list[str] = field(default_factory=list)
    heads: int = 0
    last_seq: int = 0

    @property
    def missing(self) -> bool:
        return self.size is None and not self.problems

    def __iter__(self) -> Iterator[tuple[int, str, str]]:
        if self.size is None:
            return
        try:
            with self.path.open("rb") as f:
                yield from self._heads(f, self.size)
        except OSError as exc:
            self.problems.append(f"cannot be read ({exc.strerror or exc})")

    def _heads(self, f: BinaryIO, left: int) -> Iterator[tuple[int, str, str]]:
        last_hash, number = "", 0
        while left > 0:
            line = f.readline(left)
            left -= len(line)
            number += 1
            if not line.endswith(b"\n"):
                break  # a write in flight (or cut by a crash): not a head
            record = _record(line)
            if record is None:
                self.problems.append(f"line {number} is not a witness record")
                continue
            if record["table"] != self.table:
                continue
            seq, hash_ = record["seq"], record["hash"]
            if seq < self.last_seq or (seq == self.last_seq and hash_ != last_hash):
                self.problems.append(
                    f"line {number} records seq {seq} of {self.table} after seq "
                    f"{self.last_seq}" + ("" if seq < self.last_seq else " with another hash")
                    + ": a witness only grows, so a line was added that the server never "
                    "wrote")
                continue
            if seq == self.last_seq:
                continue  # the same head twice
            self.heads += 1
            self.last_seq, last_hash = seq, hash_
            yield seq, hash_, str(record.get("time", "?"))


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if (not isinstance(record, dict) or not isinstance(record.get("table"), str)
            or type(record.get("seq")) is not int or record["seq"] < 1
            or not isinstance(record.get("hash"), str) or not _HASH.match(record["hash"])):
        return None
    return record


def from_settings(settings: Any) -> Witness | None:
    """The witness ``settings.ledger_witness_file`` names, or None when it is off."""
    path = getattr(settings, "ledger_witness_file", None)
    if not path:
        return None
    return Witness(Path(path).expanduser().absolute(), str(settings.db_path))

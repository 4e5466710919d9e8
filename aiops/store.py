"""The DuckDB store: the single writer of the telemetry file, and the read-only query path.

DuckDB allows one process to hold a database file, so the aiops server owns it and everything
else reads through the server's query API. Inside the process, writes go through one
connection under a lock and are whole Arrow batches (never row-by-row inserts); reads use their
own cursors so they run beside ingest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from aiops import sqlguard, store_archive
from aiops.errors import (
    QueryRejected,
    QueryTimeout,
    ResultTooLarge,
    SchemaMismatch,
    StoreError,
)
from aiops.fileperms import private_dir, private_file
from aiops.lake import EVERY_SERVER, CommitResult, Lake, LakeOptions
from aiops.ledger import CHAINED_TABLES, GENESIS, Anchor, link_entries
from aiops.migrations import apply_migrations
from aiops.querywatch import QueryWatch
from aiops.schema import table
from aiops.store_conform import conform
from aiops.witness import Witness

__all__ = ["TIME_SERIES_TABLES", "TRACE_INDEX", "QueryResult", "Store"]

log = logging.getLogger(__name__)

# Statements the read-only path accepts. EXPLAIN is harmless and useful when tuning queries.
TRACE_INDEX = "spans_trace_id"
# DuckDB 2 refuses to close a connection a cursor is in a call on; 1.5 has no such error.
_IN_USE: type[Exception] = getattr(duckdb, "ResourceInUseException", duckdb.ConnectionException)
_READ_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


class Store:
    """Owns one DuckDB database; ``path=None`` gives an in-memory database. Its files are
    private (``aiops.fileperms``); ``witness`` gets each new head of a hash-chained table."""

    def __init__(self, path: Path | None, memory_limit_mb: int | None = None,
                 trace_index: bool | None = None, witness: Witness | None = None,
                 lake: LakeOptions | None = None) -> None:
        self.path = path
        self.witness = witness
        # Hash-chained tables: their head (seq, hash), and an anchor file beside the database.
        self._heads: dict[str, tuple[int, str]] = {}
        if path is not None:
            private_dir(path.parent)
        self._write_lock = threading.Lock()
        # DuckDB (2.x) refuses to close a connection while any of its cursors is in a call
        # (ResourceInUseException). Every statement runs on a cursor made by _cursor(), which
        # keeps it here; close() stops new ones, interrupts those in flight and waits for them.
        self._conn_lock = threading.Lock()
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        self._closing = False
        self._closed = False
        self._catalog_cache: sqlguard.Catalog | None = None
        # Set when DuckDB has invalidated the database (a fatal error: an allocation failed in
        # a checkpoint): every statement fails until the file is opened again (_reopen).
        self.broken: str | None = None
        self.reopened = 0
        self._reopen_lock = threading.Lock()
        self._reopen_at = 0.0
        self._memory_limit_mb = memory_limit_mb
        # Queries come from HTTP clients: no SQL may read or write files outside the database
        # (read_csv('/etc/...'), COPY, ATTACH, extensions) except the Parquet archive of
        # retention, and nothing may switch that back on.
        self.archive_dir = (path.parent / "archive") if path is not None else None
        self._allowed: list[str] = []
        if self.archive_dir is not None:
            self.archive_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            for archived in (self.archive_dir, *self.archive_dir.rglob("*")):
                private_file(archived)  # ours, also those from before files were private
            self._allowed.append(str(self.archive_dir))
        # The lake (its catalog and data path) is reached only through the attached database.
        self.lake = Lake(lake, TIME_SERIES_TABLES) if lake is not None else None
        self._extension_dir: Path | None = None
        if self.lake is not None and lake is not None:
            self._extension_dir = path.parent / "extensions" if path is not None \
                else Path(tempfile.mkdtemp(prefix="aiops-extensions-"))
            self._allowed.append(str(lake.data_path.absolute()))
        self._conn = self._open(trace_index)
        self._refresh_archive_views()
        self._private_files()

    def _open(self, trace_index: bool | None = None) -> duckdb.DuckDBPyConnection:
        """Open the database file and set the connection up (at start, and again after
        DuckDB invalidated it)."""
        path = self.path
        try:
            self._conn = conn = duckdb.connect(str(path) if path else ":memory:")
        except duckdb.Error as exc:
            raise StoreError(f"cannot open DuckDB database {path}: {exc}") from exc
        self.schema_version = apply_migrations(conn)
        if self.lake is not None and self._extension_dir is not None:
            self.lake.attach(conn, self._extension_dir)
        if self._allowed:
            conn.execute("SET allowed_directories = ?", [self._allowed])
        # DuckDB sizes its thread pool from the machine; respect the CPUs this process may
        # actually use (taskset, cgroup cpusets), or its threads contend for them.
        conn.execute(f"SET threads = {max(1, len(os.sched_getaffinity(0)))}")
        if self._memory_limit_mb is not None:
            # DuckDB's buffer pool: cached blocks of the database itself, evictable to disk.
            conn.execute(f"SET memory_limit = '{int(self._memory_limit_mb)}MB'")
        if trace_index is not None:
            self._trace_index(trace_index)
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
        return conn

    # -- a database DuckDB invalidated ------------------------------------------------------

    def _note(self, exc: BaseException) -> None:
        """Remember a fatal error: DuckDB has invalidated the database, and every statement
        on it will fail until it is opened again."""
        if _invalidated(exc) and self.broken is None:
            self.broken = str(exc).splitlines()[0][:300]
            log.error("DuckDB invalidated the database (%s); it is opened again before the "
                      "next statement", self.broken)

    def _reopen(self) -> None:
        """Open the file again: what was committed (and acknowledged) is in it or its WAL,
        which DuckDB replays. At most once a second; while it fails, ``broken`` stays."""
        with self._reopen_lock:
            if self.broken is None or self._closing or \
                    time.monotonic() - self._reopen_at < 1.0:
                return
            self._reopen_at = time.monotonic()
            with self._conn_lock:
                for cur in list(self._cursors):
                    with contextlib.suppress(duckdb.Error):
                        cur.interrupt()
                try:
                    self._conn.close()
                except duckdb.Error as exc:  # a statement still unwinding: the next try
                    log.warning("cannot close the invalidated database yet: %s", exc)
                    return
                try:
                    self._open()
                except (duckdb.Error, StoreError) as exc:
                    log.error("cannot open the database again: %s", exc)
                    return
                self._heads.clear()  # read again from the file: the truth after a replay
                self._catalog_cache = None
                self.broken = None
                self.reopened += 1
            log.warning("the database is open again (%d time(s) since start)", self.reopened)

    def _trace_index(self, on: bool) -> None:
        """An ART index on spans.trace_id (setting ``store_trace_index``): a trace of any age
        in about a millisecond instead of a scan of every span; it costs memory and disk per
        span and slows span ingest (docs/scaling.md has the figures)."""
        try:
            self._conn.execute(f"CREATE INDEX IF NOT EXISTS {TRACE_INDEX} ON spans(trace_id)"
                               if on else f"DROP INDEX IF EXISTS {TRACE_INDEX}")
        except duckdb.Error as exc:
            raise StoreError(f"cannot {'create' if on else 'drop'} the trace index: {exc}"
                             ) from exc

    # -- writes ----------------------------------------------------------------------------

    def append(self, table_name: str, batch: pa.Table | pa.RecordBatch) -> int:
        """Append one Arrow batch to a declared table; return the number of rows written."""
        return self.append_many({table_name: batch})

    def append_many(self, batches: dict[str, pa.Table | pa.RecordBatch],
                    chained: dict[str, list[dict[str, Any]]] | None = None) -> int:
        """Append several batches in one transaction: all of them land or none does.

        ``chained`` entries (per hash-chained table) are linked onto the table's chain under
        the same lock and in the same transaction, so the chain never forks or skips.
        """
        # (table, rows, whether the rows hold the derived columns already: store_conform)
        prepared = [(table(name), *conform(table(name), b)) for name, b in batches.items()]
        prepared = [(t, b, given) for t, b, given in prepared if b.num_rows]
        chained = {k: v for k, v in (chained or {}).items() if v}
        if not prepared and not chained:
            return 0
        with self._write_lock:
            heads = {name: self._head(name) for name in chained}
            new_heads = {}
            for name, entries in chained.items():
                linked, new_heads[name] = link_entries(table(name), entries, *heads[name])
                prepared.append((table(name), linked, False))
            cur = self._cursor()
            try:
                cur.execute("BEGIN TRANSACTION")
                for i, (t, data, given) in enumerate(prepared):
                    view = f"_append_{i}"
                    cur.register(view, data)
                    select = t.insert_select(view, given)
                    cur.execute(f"INSERT INTO {t.name} {select}")
                    if self.lake is not None and (copy := self.lake.outbox_insert(t.name,
                                                                                  select)):
                        cur.execute(copy)  # for the lake, in the same transaction
                    cur.unregister(view)
                cur.execute("COMMIT")
            except (duckdb.ConversionException, duckdb.InvalidInputException,
                    duckdb.ConstraintException) as exc:
                _rollback(cur)
                if _invalidated(exc):  # not the rows' doing: retry once it is open again
                    self._note(exc)
                    raise StoreError(f"append failed: {exc}") from exc
                raise SchemaMismatch(f"rows refused: {exc}") from exc  # retrying will not help
            except duckdb.Error as exc:
                _rollback(cur)
                self._note(exc)
                raise StoreError(f"append failed: {exc}") from exc
            finally:
                cur.close()
            # Committed: nothing below may raise (a caller would retry rows that are stored).
            self._private_files()  # DuckDB makes the WAL anew after each checkpoint
            for name, head in new_heads.items():
                self._heads[name] = head
                anchor = self.anchor(name)
                try:
                    if anchor is not None:
                        anchor.write(*head)
                except OSError as exc:  # verify reports the anchor behind; the next write fixes it
                    log.error("cannot write the anchor of %s (seq %d): %s", name, head[0], exc)
                self._witness(name, *head)
        return sum(b.num_rows for _, b, _ in prepared)

    def _private_files(self) -> None:
        """The database and its WAL made 0600 (``aiops server``'s umask makes them so from
        the start; this covers other processes)."""
        if self.path is not None:
            private_file(self.path)
            private_file(self.path.with_name(self.path.name + ".wal"))

    def _witness(self, name: str, seq: int, hash_: str) -> None:
        if self.witness is None:
            return
        try:
            self.witness.append(name, seq, hash_)
        except OSError as exc:  # committed: the next head witnessed covers these entries too
            log.error("cannot append the head of %s (seq %d) to the ledger witness %s: %s",
                      name, seq, self.witness.path, exc.strerror or exc)

    def witness_heads(self) -> None:
        """Witness the head of each chained table the witness has no head of yet (turned on
        for an existing ledger). Tables it has heads of are left alone: a ledger changed
        while the server was stopped is not vouched for."""
        witness = self.witness
        try:
            fresh = [n for n in CHAINED_TABLES if witness is not None and self._head(n)[0]
                     and witness.last_seq(n) is None]
        except OSError as exc:
            log.error("cannot read the ledger witness: %s", exc)
            return
        for name in fresh:
            self._witness(name, *self._head(name))

    # -- retention -------------------------------------------------------------------------

    def archive(self, table_name: str, cutoff_ns: int) -> int:
        """Move rows of ``table_name`` older than ``cutoff_ns`` out of the database (to the
        archive, or nowhere with a lake: it has them); return how many moved."""
        return store_archive.archive(self, table_name, cutoff_ns)

    def _refresh_archive_views(self) -> None:
        store_archive.refresh_views(self)

    # -- the lake (``aiops.lake``) ------------------------------------------------------------

    def commit_lake(self) -> CommitResult:
        """Move the rows the lake does not hold yet into it (StoreError where it fails)."""
        if self.lake is None:
            raise StoreError("no lake is attached")
        return self.lake.commit(self._cursor, lambda: self._write_lock)

    def lake_waiting(self) -> int:
        return 0 if self.lake is None else self.lake.waiting(self._cursor)

    def lake_upkeep(self) -> None:
        if self.lake is not None:
            self.lake.upkeep(self._cursor)

    def anchor(self, table_name: str) -> Anchor | None:
        """Where the head of a hash-chained table is kept, outside the database."""
        if self.path is None:
            return None
        return Anchor(self.path.with_name(f"{self.path.stem}.{table_name}.head"))

    def _head(self, name: str) -> tuple[int, str]:
        if name not in self._heads:
            rows = self.query(f"SELECT seq, hash FROM {table(name).name} "
                              "ORDER BY seq DESC LIMIT 1").rows
            self._heads[name] = (int(rows[0][0]), str(rows[0][1])) if rows else (0, GENESIS)
        return self._heads[name]

    # -- reads -----------------------------------------------------------------------------

    def query(
        self, sql: str, params: list[Any] | None = None, limit: int | None = None,
        timeout_s: float | None = None, every_server: bool = False,
    ) -> QueryResult:
        """Run one read-only statement; at most ``limit`` rows come back, and a statement
        still running after ``timeout_s`` is interrupted (QueryTimeout). ``every_server``:
        with a lake, ``spans``, ``logs`` and ``metric_points`` name every server's rows."""
        self._check_read_only(sql)
        cur = self._cursor(every_server)
        timer = threading.Timer(timeout_s, cur.interrupt) if timeout_s else None
        if timer is not None:
            timer.start()
        try:
            rel = cur.execute(sql, params or [])
            columns = [d[0] for d in rel.description or []]
            types = [str(d[1]) for d in rel.description or []]
            rows = rel.fetchmany(limit + 1) if limit is not None else rel.fetchall()
        except duckdb.InterruptException as exc:
            raise self._interrupted(timeout_s) from exc
        except duckdb.Error as exc:
            self._note(exc)
            raise StoreError(f"query failed: {exc}") from exc
        finally:
            if timer is not None:
                timer.cancel()
            cur.close()
        truncated = limit is not None and len(rows) > limit
        return QueryResult(columns, types, rows[:limit] if truncated else rows, truncated)

    def query_untrusted(
        self, sql: str, params: list[Any] | None, limit: int, timeout_s: float,
        max_bytes: int, max_memory_bytes: int | None = None, every_server: bool = False,
    ) -> QueryResult:
        """Run SQL from outside the process (HTTP API, Grafana, the agent) so that it cannot
        change anything: ``sqlguard`` admits one SELECT over the store's tables with no file,
        settings or state-changing function, and the statement runs in a ``READ ONLY``
        transaction, so DuckDB itself refuses any write whatever the check missed. It is
        interrupted after ``timeout_s`` (QueryTimeout) and stopped once its rows pass
        ``max_bytes`` (ResultTooLarge), or once the process grew by ``max_memory_bytes``
        while it ran (``aiops.querywatch``; ResultTooLarge); its cursor and thread are
        released whatever happens. ``every_server`` as for ``query``.
        """
        cur = self._cursor(every_server)
        watch = QueryWatch(cur.interrupt, timeout_s, max_memory_bytes,
                           pooled=self._pooled_bytes).__enter__()
        try:
            count = len(cur.extract_statements(sql))
            if count != 1:
                raise QueryRejected(f"expected exactly one statement, got {count}")
            sqlguard.check(sql, lambda q: str((cur.execute(
                "SELECT json_serialize_sql(?)", [q]).fetchone() or ("",))[0]),
                self._catalog(cur))
            cur.execute("BEGIN TRANSACTION READ ONLY")
            rel = cur.execute(sql, params or [])
            columns = [d[0] for d in rel.description or []]
            types = [str(d[1]) for d in rel.description or []]
            rows: list[tuple[Any, ...]] = []
            size = 0
            while len(rows) <= limit and (chunk := rel.fetchmany(min(256, limit + 1))):
                size += sum(_approx_bytes(r) for r in chunk)
                if size > max_bytes:
                    raise ResultTooLarge(f"the result passed {max_bytes} bytes: select fewer "
                                         "rows or columns, or aggregate")
                rows.extend(chunk)
        except duckdb.InterruptException as exc:
            if watch.reason == "memory":
                raise ResultTooLarge(_TOO_MUCH_MEMORY.format(
                    mib=f"its {(max_memory_bytes or 0) >> 20} MiB")) from exc
            raise self._interrupted(timeout_s) from exc
        except duckdb.OutOfMemoryException as exc:
            # Past the process's data cap: this query alone fails, and (the allocator does
            # not retain, see aiops/__init__.py) its memory goes back.
            raise ResultTooLarge(_TOO_MUCH_MEMORY.format(mib="the server's share")) from exc
        except duckdb.TransactionException as exc:
            raise QueryRejected(f"this query would write: {exc}") from exc
        except duckdb.Error as exc:
            self._note(exc)
            raise StoreError(f"query failed: {exc}") from exc
        except MemoryError as exc:  # the rows, as Python objects, past the data cap
            raise ResultTooLarge(_TOO_MUCH_MEMORY.format(mib="the server's share")) from exc
        finally:
            watch.__exit__()
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            cur.close()
        truncated = len(rows) > limit
        return QueryResult(columns, types, rows[:limit], truncated)

    def _pooled_bytes(self) -> int:
        """What DuckDB's buffer manager holds now (blocks, hash tables, sorts)."""
        cur = self._cursor()
        try:
            row = cur.execute("SELECT sum(memory_usage_bytes)::BIGINT FROM duckdb_memory()"
                              ).fetchone()
            return int(row[0] or 0) if row else 0
        finally:
            cur.close()

    def _catalog(self, cur: duckdb.DuckDBPyConnection) -> sqlguard.Catalog:
        if self._catalog_cache is None:
            own = cur.execute(
                "SELECT lower(table_name) FROM duckdb_tables() WHERE database_name = "
                "current_database() AND schema_name = 'main' UNION SELECT lower(view_name) "
                "FROM duckdb_views() WHERE database_name = current_database() AND "
                "schema_name = 'main' AND NOT internal").fetchall()
            engine = cur.execute(
                "SELECT lower(view_name) FROM duckdb_views() WHERE internal UNION SELECT "
                "lower(table_name) FROM duckdb_tables() WHERE internal").fetchall()
            tables = frozenset(r[0] for r in own)
            self._catalog_cache = sqlguard.Catalog(tables, frozenset(r[0] for r in engine)
                                                   - tables)
        return self._catalog_cache

    def query_arrow(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        """Run one read-only statement and return all rows as an Arrow table."""
        self._check_read_only(sql)
        cur = self._cursor()
        try:
            return cur.sql(sql, params=params or None).to_arrow_table()
        except duckdb.Error as exc:
            self._note(exc)
            raise StoreError(f"query failed: {exc}") from exc
        finally:
            cur.close()

    def iter_rows(self, sql: str, batch: int = 10_000) -> Iterator[tuple[Any, ...]]:
        """Stream the rows of one read-only statement, ``batch`` at a time."""
        self._check_read_only(sql)
        cur = self._cursor()
        try:
            cur.execute(sql)
            while rows := cur.fetchmany(batch):
                yield from rows
        except duckdb.Error as exc:
            self._note(exc)
            raise StoreError(f"query failed: {exc}") from exc
        finally:
            cur.close()

    def count(self, table_name: str) -> int:
        t = table(table_name)
        return int(self.query(f"SELECT count(*) FROM {t.name}").rows[0][0])

    def ping(self) -> None:
        """StoreError unless a statement runs (and the database is not invalidated)."""
        self.query("SELECT 1")
        if self.broken is not None:
            raise StoreError(f"the database is broken: {self.broken}")

    def close(self, wait_s: float = 10.0) -> None:
        """Refuse new statements, interrupt those still running, then close the database.

        Writes hold the write lock, so a write in flight finishes (or rolls back) first; a
        read in flight ends with StoreError. Raises StoreError if a statement is still in a
        call after ``wait_s``.
        """
        with self._conn_lock:
            self._closing = True
        with self._write_lock:
            deadline = time.monotonic() + wait_s
            while True:
                with self._conn_lock:
                    if self._closed:
                        return
                    for cur in list(self._cursors):
                        with contextlib.suppress(duckdb.Error):
                            cur.interrupt()
                    try:
                        self._conn.close()
                        self._closed = True
                        return
                    except _IN_USE as exc:
                        if time.monotonic() > deadline:
                            raise StoreError(f"cannot close the database: {exc}") from exc
                time.sleep(0.01)  # the interrupted statements unwind in their threads

    def _cursor(self, every_server: bool = False) -> duckdb.DuckDBPyConnection:
        """A cursor of its own for one statement, known to close(). ``every_server`` (with a
        lake): the time-series tables' names resolve to the lake's views of every server
        (``aiops.lake.EVERY_SERVER``), so the same SQL reads one server or all of them."""
        if self.broken is not None:
            self._reopen()
        with self._conn_lock:
            if self._closing:
                raise StoreError("the store is closed")
            cur = self._conn.cursor()
            self._cursors.add(cur)
        if every_server and self.lake is not None:
            cur.execute(f"SET search_path = '{EVERY_SERVER},main'")
        return cur

    def _interrupted(self, timeout_s: float | None) -> StoreError:
        if self._closing:
            return StoreError("query interrupted: the store is closing")
        return QueryTimeout(f"query interrupted after {timeout_s:g} s")

    def _check_read_only(self, sql: str) -> None:
        with self._cursor() as cur:
            try:
                statements = cur.extract_statements(sql)
            except duckdb.Error as exc:
                raise QueryRejected(f"cannot parse query: {exc}") from exc
        if len(statements) != 1:
            raise QueryRejected(f"expected exactly one statement, got {len(statements)}")
        kind = statements[0].type
        if kind not in _READ_TYPES:
            raise QueryRejected(f"only SELECT queries are allowed here, not {kind.name}")


_TOO_MUCH_MEMORY = ("the query needed more than {mib} of memory: select fewer rows or "
                    "smaller values, or aggregate")


def _invalidated(exc: BaseException) -> bool:
    """DuckDB's fatal errors, and what every later statement says after one."""
    return isinstance(exc, duckdb.FatalException) or "database has been invalidated" in str(exc)


def _rollback(cur: duckdb.DuckDBPyConnection) -> None:
    """Roll back what is left: a failed COMMIT has ended the transaction already, and an
    invalidated database has nothing left to roll back."""
    with contextlib.suppress(duckdb.TransactionException, duckdb.FatalException):
        cur.execute("ROLLBACK")


def _approx_bytes(value: Any) -> int:
    """About how many bytes a fetched value takes: its text or bytes, or a machine word."""
    if isinstance(value, str | bytes | bytearray):
        return len(value)
    if isinstance(value, tuple | list):
        return 8 + sum(_approx_bytes(v) for v in value)
    if isinstance(value, dict):
        return 8 + sum(_approx_bytes(k) + _approx_bytes(v) for k, v in value.items())
    return 8


# Time-series tables: retention ages them, the lake holds them.
TIME_SERIES_TABLES = tuple(store_archive.TIME_COLUMNS)

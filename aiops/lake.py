"""Telemetry past one server: DuckLake (a PostgreSQL catalog, Parquet files on shared storage).

Each aiops server keeps its recent rows in its own DuckDB file, where detection reads them
within seconds, and commits them to the lake on a schedule; ``<table>_all`` reads every
server's rows through the lake, so the SQL of dashboards and the agent does not change.

Exactly once, whatever dies when: every append also lands, in the same local transaction, in
an outbox table under a batch number. A commit copies the outbox's batches up to N into the
lake and records (server, N) in the lake's commits table, in one lake transaction, and empties
the outbox after. A crash between the two leaves batches the lake holds already: the next
commit skips them by number. Acknowledged rows are in the local file (its WAL) from the moment
they are acknowledged, so neither a killed server nor an unreachable catalog loses any.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from aiops.config import Settings
from aiops.errors import StoreError

__all__ = ["BATCH", "CATALOG", "COMMITS", "SERVER_ID", "Lake", "LakeOptions", "lake_unavailable",
           "outbox"]

log = logging.getLogger(__name__)

CATALOG = "lake"  # the name the lake is attached under
COMMITS = "aiops_lake_commits"  # (server_id, upto, rows, time): the batches each server committed
SERVER_ID = "server_id"  # the column every lake row carries: which server wrote it
BATCH = "lake_batch"  # the outbox's batch number
# A schema of views named like the time-series tables over their ``<table>_all``: a reader
# that puts it first in its search path (the agent's) reads every server with the same SQL.
EVERY_SERVER = "every_server"
# DuckDB finds an extension's entry point by its file name, which the PyPI wheels do not use.
_EXTENSIONS = (("postgres_scanner", "duckdb_extension_postgres"),
               ("ducklake", "duckdb_extension_ducklake"))
INSTALL_HINT = ("the lake runs on DuckDB 1.5.5 with its extension wheels (`pip install "
                "'aiops[lake]'`; in the repository `make lake-env` and "
                "PYTHONPATH=.build/lake-duckdb: docs/scaling.md)")
_CREATE_TRIES = 5  # two servers starting together both create the lake's tables: one loses


def outbox(table_name: str) -> str:
    return f"lake_outbox_{table_name}"


@dataclass(frozen=True)
class LakeOptions:
    """Where the lake is and who this server is in it (settings ``lake_*``)."""

    catalog: str  # libpq connection string of the PostgreSQL catalog database
    data_path: Path  # the Parquet files, on storage every server reaches
    server_id: str
    commit_interval_s: float = 5.0
    upkeep_interval_s: float = 3600.0  # merge small files, expire old snapshots; 0: never
    snapshots_kept_s: float = 3600.0  # time travel kept; older snapshots' files are deleted

    @classmethod
    def of(cls, settings: Settings) -> LakeOptions | None:
        """The lake the settings name; None for the embedded default."""
        if settings.storage_backend != "ducklake" or settings.lake_data_path is None:
            return None
        return cls(settings.lake_catalog, settings.lake_data_path,
                   settings.server_id or f"{socket.gethostname()}:{settings.server_port}",
                   settings.lake_commit_interval_s, settings.lake_upkeep_interval_s)


@dataclass
class CommitResult:
    upto: int  # the highest batch the lake holds of this server
    rows: int  # rows this commit moved


class Lake:
    """The lake as one server's store sees it; the store calls it under its own locks."""

    def __init__(self, options: LakeOptions, tables: tuple[str, ...]) -> None:
        self.options = options
        self.tables = tables
        self.columns: dict[str, str] = {}  # per table, its columns in order, quoted
        self.committed = 0  # highest batch the lake holds of this server
        self.batch = 1  # the batch appends go to now; a commit closes it

    # -- set-up, on the store's connection before it is locked down --------------------------

    def attach(self, conn: duckdb.DuckDBPyConnection, extension_dir: Path) -> None:
        o = self.options
        _load_extensions(conn, extension_dir)
        o.data_path.mkdir(parents=True, exist_ok=True)
        dsn, data = _quote(o.catalog), _quote(str(o.data_path.absolute()) + "/")
        for attempt in range(_CREATE_TRIES):
            try:
                conn.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS {CATALOG} "
                             f"(DATA_PATH '{data}')")
                break
            except duckdb.Error as exc:
                # Two servers making a new lake's catalog at once: one fails, then finds it.
                if attempt == _CREATE_TRIES - 1 or "Failed to initialize" not in str(exc):
                    raise StoreError(f"cannot attach the lake (catalog {_redact(o.catalog)}, "
                                     f"data {o.data_path}): {self._scrub(exc)}") from exc
                time.sleep(0.2 * (attempt + 1))
        for attempt in range(_CREATE_TRIES):
            try:
                self._create(conn)
                break
            except duckdb.TransactionException:
                if attempt == _CREATE_TRIES - 1:
                    raise
        self.committed = int(conn.execute(
            f"SELECT coalesce(max(upto), 0) FROM {CATALOG}.{COMMITS} WHERE {SERVER_ID} = ?",
            [o.server_id]).fetchone()[0])  # type: ignore[index]
        self.batch = self.committed + 1
        for name in self.tables:
            (last,) = conn.execute(f"SELECT max({BATCH}) FROM {outbox(name)}").fetchone() \
                or (None,)
            self.batch = max(self.batch, int(last or 0) + 1)
        if not self.committed and self._outbox_empty(conn):
            # Rows stored before the lake was on: into the lake with the first commit.
            for name in self.tables:
                conn.execute(f"INSERT INTO {outbox(name)} BY NAME SELECT *, {self.batch} "
                             f"AS {BATCH} FROM {name}")

    def _create(self, conn: duckdb.DuckDBPyConnection) -> None:
        """The lake's tables (the local ones plus ``server_id``), columns a newer schema added,
        and the local outboxes."""
        conn.execute(f"CREATE TABLE IF NOT EXISTS {CATALOG}.{COMMITS} ({SERVER_ID} VARCHAR, "
                     "upto BIGINT, rows BIGINT, time TIMESTAMPTZ)")
        for name in self.tables:
            columns = conn.execute("SELECT column_name, data_type FROM duckdb_columns() "
                                   "WHERE database_name = current_database() AND "
                                   "schema_name = 'main' AND table_name = ? "
                                   "ORDER BY column_index", [name]).fetchall()
            self.columns[name] = ", ".join(f'"{c}"' for c, _ in columns)
            conn.execute(f"CREATE TABLE IF NOT EXISTS {CATALOG}.{name} ({SERVER_ID} VARCHAR, "
                         + ", ".join(f'"{c}" {t}' for c, t in columns) + ")")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {outbox(name)} AS "
                         f"SELECT *, 0::BIGINT AS {BATCH} FROM {name} LIMIT 0")
            for database, target in ((CATALOG, f"{CATALOG}.{name}"),
                                     (None, outbox(name))):
                have = {r[0] for r in conn.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                    "coalesce(?, current_database()) AND schema_name = 'main' AND "
                    "table_name = ?", [database, target.split(".")[-1]]).fetchall()}
                for c, t in columns:
                    if c not in have:  # a column a newer schema added
                        conn.execute(f'ALTER TABLE {target} ADD COLUMN "{c}" {t}')

    def _outbox_empty(self, conn: duckdb.DuckDBPyConnection) -> bool:
        return all(not conn.execute(f"SELECT 1 FROM {outbox(n)} LIMIT 1").fetchone()
                   for n in self.tables)

    # -- the write path ------------------------------------------------------------------

    def outbox_insert(self, table_name: str, select: str) -> str | None:
        """The statement that copies an append's rows (``select``) into the outbox, in the
        append's own transaction; None for a table the lake does not hold."""
        if table_name not in self.tables:
            return None
        # By position, as the table's own insert: the SELECT's derived columns have no names.
        return (f"INSERT INTO {outbox(table_name)} ({self.columns[table_name]}, {BATCH}) "
                f"SELECT *, {self.batch}::BIGINT FROM ({select})")

    # -- commits ---------------------------------------------------------------------------

    def commit(self, cursor: Callable[[], duckdb.DuckDBPyConnection],
               writes: Callable[[], contextlib.AbstractContextManager[object]]) -> CommitResult:
        """Move the outbox's committed batches into the lake; raises StoreError (the catalog
        or the data path unreachable, a conflict after DuckLake's own retries)."""
        with writes():  # no append is half done: every batch up to this one is stored
            upto = self.batch
            self.batch += 1
        rows = 0
        if self.waiting(cursor):
            with _cursor(cursor) as cur:
                try:
                    cur.execute("BEGIN TRANSACTION")
                    for name in self.tables:
                        (n,) = cur.execute(
                            f"INSERT INTO {CATALOG}.{name} BY NAME SELECT * EXCLUDE ({BATCH}), "
                            f"? AS {SERVER_ID} FROM {outbox(name)} WHERE {BATCH} > ? AND "
                            f"{BATCH} <= ?", [self.options.server_id, self.committed, upto]
                        ).fetchone() or (0,)
                        rows += int(n)
                    cur.execute(f"INSERT INTO {CATALOG}.{COMMITS} VALUES (?, ?, ?, now())",
                                [self.options.server_id, upto, rows])
                    cur.execute("COMMIT")
                except duckdb.Error as exc:
                    with contextlib.suppress(duckdb.Error):
                        cur.execute("ROLLBACK")
                    raise StoreError(f"lake commit failed: {self._scrub(exc)}") from exc
            self.committed = upto
        with writes(), _cursor(cursor) as cur:
            for name in self.tables:
                cur.execute(f"DELETE FROM {outbox(name)} WHERE {BATCH} <= ?", [self.committed])
        return CommitResult(self.committed, rows)

    def waiting(self, cursor: Callable[[], duckdb.DuckDBPyConnection]) -> int:
        """Rows stored here that the lake does not hold yet."""
        total = 0
        with _cursor(cursor) as cur:
            for n in self.tables:
                row = cur.execute(f"SELECT count(*) FROM {outbox(n)} WHERE {BATCH} > ?",
                                  [self.committed]).fetchone()
                total += int(row[0]) if row else 0
        return total

    def upkeep(self, cursor: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        """Merge small files, expire snapshots older than ``snapshots_kept_s`` and delete the
        files only they used (DuckLake's own maintenance functions)."""
        kept = float(self.options.snapshots_kept_s)
        with _cursor(cursor) as cur:
            try:
                cur.execute(f"CALL ducklake_merge_adjacent_files('{CATALOG}')")
                cur.execute(f"CALL ducklake_expire_snapshots('{CATALOG}', older_than => "
                            f"now() - to_seconds({kept}))")
                cur.execute(f"CALL ducklake_cleanup_old_files('{CATALOG}', cleanup_all => true)")
            except duckdb.Error as exc:
                raise StoreError(f"lake upkeep failed: {self._scrub(exc)}") from exc

    def _scrub(self, exc: Exception) -> str:
        """DuckDB's message names the connection string: without its password."""
        return str(exc).replace(self.options.catalog, _redact(self.options.catalog))

    # -- reads ---------------------------------------------------------------------------

    def view_source(self, table_name: str) -> str:
        """``<table>_all``: every server's rows in the lake, and this server's not yet there."""
        me = _quote(self.options.server_id)
        return (f"SELECT * FROM {CATALOG}.{table_name} UNION ALL BY NAME "
                f"SELECT * EXCLUDE ({BATCH}), '{me}' AS {SERVER_ID} FROM {outbox(table_name)} "
                f"WHERE {BATCH} > (SELECT coalesce(max(upto), 0) FROM {CATALOG}.{COMMITS} "
                f"WHERE {SERVER_ID} = '{me}')")


def _extension_files() -> list[tuple[str, Path]]:
    """(the name DuckDB loads it by, the file the PyPI wheel installed) per extension."""
    found = []
    for name, package in _EXTENSIONS:
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise StoreError(f"the lake needs the {package.replace('_', '-')} package: "
                             f"{INSTALL_HINT}") from exc
        found.append((name, next(Path(str(module.__file__)).parent.rglob("*.duckdb_extension"))))
    return found


def lake_unavailable() -> str | None:
    """Why this environment cannot attach a lake (its DuckDB is not the one the extension
    wheels are built for, or they are missing); None where it can."""
    try:
        files = _extension_files()
    except StoreError as exc:
        return str(exc)
    for name, source in files:
        if source.parent.name != f"v{duckdb.__version__}":
            return (f"DuckDB's {name} extension here is built for DuckDB "
                    f"{source.parent.name.lstrip('v')}, and this is DuckDB {duckdb.__version__}: "
                    f"{INSTALL_HINT}")
    return None


def _load_extensions(conn: duckdb.DuckDBPyConnection, folder: Path) -> None:
    if (why := lake_unavailable()) is not None:
        raise StoreError(f"cannot attach the lake: {why}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, source in _extension_files():
        target = folder / f"{name}.duckdb_extension"
        if not target.is_symlink() or target.readlink() != source:
            target.unlink(missing_ok=True)
            target.symlink_to(source)
        try:
            conn.execute(f"LOAD '{_quote(str(target))}'")
        except duckdb.Error as exc:
            raise StoreError(f"cannot load DuckDB's {name} extension from {source}: {exc}"
                             ) from exc


@contextlib.contextmanager
def _cursor(make: Callable[[], duckdb.DuckDBPyConnection]
            ) -> Iterator[duckdb.DuckDBPyConnection]:
    cur = make()
    try:
        yield cur
    finally:
        cur.close()


def _quote(text: str) -> str:
    return text.replace("'", "''")


def _redact(dsn: str) -> str:
    """A connection string as logs may show it: without its password."""
    return " ".join("password=***" if p.startswith("password=") else p for p in dsn.split())

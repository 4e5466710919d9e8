"""Where a store's old rows go, and the ``<table>_all`` views that read them back: retention's
Parquet files beside the database, or the lake (``aiops.lake``) when one is attached."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from aiops.errors import StoreError
from aiops.fileperms import private_file
from aiops.lake import EVERY_SERVER
from aiops.schema import table

if TYPE_CHECKING:
    from aiops.store import Store

__all__ = ["TIME_COLUMNS", "archive", "refresh_views"]

log = logging.getLogger(__name__)

# Time-series tables and the column retention ages them by.
TIME_COLUMNS = {"spans": "start_time", "logs": "time", "metric_points": "time"}


def archive(store: Store, table_name: str, cutoff_ns: int) -> int:
    """Move rows of ``table_name`` older than ``cutoff_ns`` out of the database; return how
    many moved. With a lake the rows are there already (or in its outbox): they are deleted.
    Without, they go to a Parquet file in the archive, written first and recorded, with the
    delete, in one transaction: a crash in between leaves a file no run recorded, which the
    next run removes."""
    t = table(table_name)
    where = f"{TIME_COLUMNS[t.name]} < make_timestamp_ns(?)"
    if store.lake is None and store.archive_dir is None:
        raise StoreError("an in-memory store has no archive")
    with store._write_lock:
        folder = None if store.lake is not None or store.archive_dir is None \
            else store.archive_dir / t.name
        if folder is not None:
            folder.mkdir(mode=0o700, exist_ok=True)
            _drop_unrecorded(store, folder)
        cur = store._cursor()
        try:
            (n,) = cur.execute(f"SELECT count(*) FROM {t.name} WHERE {where}",
                               [cutoff_ns]).fetchone() or (0,)
            if not n:
                return 0
            path = None
            if folder is not None:
                path = folder / f"{t.name}-until-{cutoff_ns}.parquet"
                cur.execute(f"COPY (SELECT * FROM {t.name} WHERE {where} ORDER BY "
                            f"{TIME_COLUMNS[t.name]}) TO '{path}' (FORMAT parquet, "
                            "COMPRESSION zstd)", [cutoff_ns])
                private_file(path)
            cur.execute("BEGIN TRANSACTION")
            cur.execute(f"DELETE FROM {t.name} WHERE {where}", [cutoff_ns])
            cur.execute("INSERT INTO retention_runs VALUES (?, make_timestamp_ns(?), ?, ?, "
                        "now())", [t.name, cutoff_ns, path.name if path else "(lake)", n])
            cur.execute("COMMIT")
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            raise StoreError(f"archiving {t.name} failed: {exc}") from exc
        finally:
            cur.close()
        refresh_views(store)
        store._private_files()
    log.info("archived %d rows of %s older than %d", n, t.name, cutoff_ns)
    return int(n)


def _drop_unrecorded(store: Store, folder: Path) -> None:
    with store._cursor() as cur:
        recorded = {r[0] for r in cur.execute(
            "SELECT file FROM retention_runs WHERE table_name = ?", [folder.name]
        ).fetchall()}
    for f in folder.glob("*.parquet"):
        if f.name not in recorded:
            log.warning("removing %s: its archive run never committed", f)
            f.unlink()


def refresh_views(store: Store) -> None:
    """``<table>_all``: live rows plus the archived ones (or the lake's), for every
    time-series table."""
    for name in TIME_COLUMNS:
        folder = store.archive_dir / name if store.archive_dir is not None else None
        source = f"SELECT * FROM {name}" if store.lake is None else store.lake.view_source(name)
        with store._cursor() as cur:
            if folder is not None and any(True for _ in folder.glob("*.parquet")):
                # Archived before the lake was on, or without one.
                files = f"read_parquet('{folder}/*.parquet', union_by_name = true)"
                present = {r[0] for r in cur.execute(f"DESCRIBE SELECT * FROM {files}")
                           .fetchall()}
                source += f" UNION ALL BY NAME {table(name).archived_select(files, present)}"
            cur.execute(f"CREATE OR REPLACE VIEW {name}_all AS {source}")
            if store.lake is not None:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {EVERY_SERVER}")
                cur.execute(f"CREATE OR REPLACE VIEW {EVERY_SERVER}.{name} AS "
                            f"SELECT * FROM main.{name}_all")

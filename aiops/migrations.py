"""Ordered schema migrations for the DuckDB store.

Each migration is a function applied once, in order, inside a transaction; the versions applied
are recorded in ``schema_migrations``. Migration 1 creates every table from ``aiops.schema``.
Later changes to a table append a migration here (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``)
so that a database created by migration 1 at any earlier release reaches the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from aiops.schema import LOGS, METRIC_POINTS, PROVENANCE, SPANS, TABLES, Kind

__all__ = ["MIGRATIONS", "Migration", "apply_migrations", "current_version"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[duckdb.DuckDBPyConnection], None]


def _create_tables(conn: duckdb.DuckDBPyConnection) -> None:
    for t in TABLES:
        conn.execute(t.ddl())


def _provenance(conn: duckdb.DuckDBPyConnection) -> None:
    conn.execute(PROVENANCE.ddl())


def _retention(conn: duckdb.DuckDBPyConnection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS retention_runs (table_name VARCHAR, "
                 "cutoff TIMESTAMP_NS, file VARCHAR, rows BIGINT, archived_at TIMESTAMP)")


def _json_as_varchar(conn: duckdb.DuckDBPyConnection) -> None:
    for t in TABLES:
        # The archive views depend on the tables; the store recreates them when it opens.
        conn.execute(f"DROP VIEW IF EXISTS {t.name}_all")
        for c in t.columns:
            if c.kind is Kind.JSON:
                conn.execute(f"ALTER TABLE {t.name} ALTER {c.name} TYPE VARCHAR")


def _drop_ebpf_samples(conn: duckdb.DuckDBPyConnection) -> None:
    # eBPF measurements arrive as OTLP metrics (metric_points, scope aiops.collectors.ebpf):
    # one table per signal kind, not one per producer.
    conn.execute("DROP VIEW IF EXISTS ebpf_samples_all")
    conn.execute("DROP TABLE IF EXISTS ebpf_samples")


CURRENT_INCIDENTS = """CREATE OR REPLACE VIEW incidents_current AS
SELECT * FROM incidents
QUALIFY row_number() OVER (PARTITION BY incident_id ORDER BY updated_at DESC) = 1"""


def _incident_history(conn: duckdb.DuckDBPyConnection) -> None:
    # Incidents change (open -> mitigating -> resolved): each change is appended as a row.
    conn.execute("ALTER TABLE incidents ADD COLUMN IF NOT EXISTS updated_at TIMESTAMP_NS")
    conn.execute(CURRENT_INCIDENTS)


CURRENT_ACTIONS = """CREATE OR REPLACE VIEW actions_current AS
SELECT * FROM actions
QUALIFY row_number() OVER (PARTITION BY action_id ORDER BY updated_at DESC) = 1"""


def _action_history(conn: duckdb.DuckDBPyConnection) -> None:
    conn.execute("ALTER TABLE actions ADD COLUMN IF NOT EXISTS updated_at TIMESTAMP_NS")
    conn.execute(CURRENT_ACTIONS)


def _ingest_credential(conn: duckdb.DuckDBPyConnection) -> None:
    # Which credential wrote a row; appended last, where a fresh table declares it too.
    for name in ("spans", "logs", "metric_points"):
        conn.execute(f"DROP VIEW IF EXISTS {name}_all")  # recreated when the store opens
        conn.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS ingest_credential VARCHAR")


def _typed_span_columns(conn: duckdb.DuckDBPyConnection) -> None:
    # model, version, replica, HTTP status and failed as typed columns (aiops.semconv), derived
    # from the JSON once here for stored rows and by the store at ingest for new ones.
    conn.execute("DROP VIEW IF EXISTS spans_all")
    for d in SPANS.derived:
        conn.execute(f"ALTER TABLE spans ADD COLUMN IF NOT EXISTS {d.name} {d.kind.duckdb}")
    if SPANS.derived:
        conn.execute("UPDATE spans SET " + ", ".join(f"{d.name} = {d.sql}"
                                                     for d in SPANS.derived))


def _typed_identity(conn: duckdb.DuckDBPyConnection) -> None:
    # The identity columns (model, version, replica, deployment, app) on every signal table,
    # read where aiops.semconv's conventions table says: spans gain deployment and app.
    for t in (SPANS, LOGS, METRIC_POINTS):
        conn.execute(f"DROP VIEW IF EXISTS {t.name}_all")  # recreated when the store opens
        have = {r[0] for r in conn.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND table_name = ?", [t.name]).fetchall()}
        added = [d for d in t.derived if d.name not in have]
        for d in added:
            conn.execute(f"ALTER TABLE {t.name} ADD COLUMN {d.name} {d.kind.duckdb}")
        if added:
            conn.execute(f"UPDATE {t.name} SET " + ", ".join(f"{d.name} = {d.sql}"
                                                              for d in added))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create telemetry tables", _create_tables),
    Migration(2, "provenance hash chain", _provenance),
    Migration(3, "retention bookkeeping", _retention),
    Migration(4, "JSON columns as VARCHAR (ingest speed)", _json_as_varchar),
    Migration(5, "eBPF samples are metric points", _drop_ebpf_samples),
    Migration(6, "incident history (updated_at) and incidents_current", _incident_history),
    Migration(7, "action history (updated_at) and actions_current", _action_history),
    Migration(8, "ingest_credential on telemetry rows", _ingest_credential),
    Migration(9, "typed span columns: model, version, replica, HTTP status, failed",
              _typed_span_columns),
    Migration(10, "typed identity columns on every signal table: model, version, replica, "
              "deployment, app", _typed_identity),
)


def current_version(conn: duckdb.DuckDBPyConnection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP DEFAULT now())"
    )
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def apply_migrations(conn: duckdb.DuckDBPyConnection) -> int:
    """Apply every migration newer than the database; return the resulting version."""
    version = current_version(conn)
    for m in MIGRATIONS:
        if m.version <= version:
            continue
        conn.execute("BEGIN TRANSACTION")
        try:
            m.apply(conn)
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                         [m.version, m.name])
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
        log.info("applied migration %d: %s", m.version, m.name)
        version = m.version
    return version

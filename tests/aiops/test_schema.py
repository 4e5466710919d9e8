"""The telemetry schema is declared once; DDL, Arrow schemas and docs derive from it."""

from pathlib import Path

import duckdb
import pyarrow as pa

from aiops.schema import TABLES, schema_reference, table

ROOT = Path(__file__).resolve().parents[2]


def test_every_table_creates_in_duckdb_with_the_declared_columns() -> None:
    conn = duckdb.connect()
    for t in TABLES:
        conn.execute(t.ddl())
        described = conn.execute(f"DESCRIBE {t.name}").fetchall()
        # The written columns, then those the store derives at ingest (aiops.semconv).
        assert [r[0] for r in described] == t.column_names + [d.name for d in t.derived]
        assert [r[1] for r in described] == [c.kind.duckdb for c in t.columns] + [
            d.kind.duckdb for d in t.derived]


def test_arrow_schema_mirrors_the_declaration() -> None:
    spans = table("spans")
    schema = spans.arrow_schema
    assert schema.names == spans.column_names
    assert schema.field("start_time").type == pa.timestamp("ns")
    assert not schema.field("trace_id").nullable
    assert schema.field("parent_span_id").nullable


def test_the_product_tables_are_all_declared() -> None:
    assert {t.name for t in TABLES} == {
        "spans", "logs", "metric_points", "incidents", "actions", "ledger",
        "provenance"}


def test_docs_schema_md_is_generated_from_the_declaration() -> None:
    assert (ROOT / "docs" / "schema.md").read_text() == schema_reference(), \
        "docs/schema.md is stale: run `make docs`"


def test_a_batch_with_its_derived_columns_is_inserted_in_the_ddl_order() -> None:
    conn = duckdb.connect()
    spans = table("spans")
    conn.execute(spans.ddl())
    described = conn.execute("DESCRIBE spans").fetchall()
    assert spans.stored_schema.names == [r[0] for r in described]
    assert spans.insert_select("batch", derived_given=True) == "SELECT * FROM batch"
    assert "json_extract_string" in spans.insert_select("batch")

"""Arrow batches made to fit a declared table before the store inserts them.

A batch's derived columns (``aiops.schema.Derived``) are the store's to compute, except where
the OTLP decoder derived them itself and marked the batch so (``semconv.DECODED_MARK``): the
store then inserts them as given, which spares the JSON parse of every row at ingest. Derived
columns without the mark (rows read back from a store, a client's own) are recomputed.
"""

from __future__ import annotations

import pyarrow as pa

from aiops import semconv
from aiops.errors import SchemaMismatch
from aiops.schema import Table

__all__ = ["conform", "decoder_derived", "mergeable", "without_derived"]

_KEY, _VALUE = semconv.DECODED_MARK


def decoder_derived(t: Table, data: pa.Table | pa.RecordBatch) -> bool:
    """Whether ``data`` holds every derived column of ``t``, as the decoder derived them."""
    meta = data.schema.metadata or {}
    return bool(t.derived) and meta.get(_KEY) == _VALUE and all(
        d.name in data.schema.names for d in t.derived)


def without_derived(t: Table, data: pa.Table) -> pa.Table:
    """``data`` without derived columns or the decoder's mark (the store derives them)."""
    data = data.drop_columns([d.name for d in t.derived if d.name in data.column_names])
    meta = {k: v for k, v in (data.schema.metadata or {}).items() if k != _KEY}
    return data.replace_schema_metadata(meta or None)


def mergeable(t: Table, batches: list[pa.Table]) -> list[pa.Table]:
    """``batches`` of ``t`` that ``pa.concat_tables`` can join: where only some carry the
    decoder's derived columns (a request that fell back to SQL), none does."""
    if len({decoder_derived(t, b) for b in batches}) < 2:
        return batches
    return [without_derived(t, b) for b in batches]


def conform(t: Table, batch: pa.Table | pa.RecordBatch) -> tuple[pa.Table, bool]:
    """``batch`` ordered and cast to the table's Arrow schema (absent nullable columns are
    NULL), and whether it carries the derived columns too (``Table.stored_schema``)."""
    data = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    derived = {d.name for d in t.derived}
    unknown = set(data.column_names) - set(t.column_names) - derived
    if unknown:
        raise SchemaMismatch(f"{t.name}: unknown columns {sorted(unknown)}")
    arrays = []
    for col in t.columns:
        if col.name in data.column_names:
            arr = _cast(t, col.name, data.column(col.name), col.kind.arrow)
            if not col.nullable and arr.null_count:
                raise SchemaMismatch(f"{t.name}.{col.name} is required but has nulls")
        elif col.nullable:
            arr = pa.nulls(data.num_rows, col.kind.arrow)
        else:
            raise SchemaMismatch(f"{t.name}: required column {col.name} is missing")
        arrays.append(arr)
    if not decoder_derived(t, data):
        return pa.Table.from_arrays(arrays, schema=t.arrow_schema), False
    arrays += [_cast(t, d.name, data.column(d.name), d.kind.arrow) for d in t.derived]
    return pa.Table.from_arrays(arrays, schema=t.stored_schema), True


def _cast(t: Table, name: str, arr: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    if arr.type == to:
        return arr
    try:
        return arr.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatch(f"{t.name}.{name}: cannot use {arr.type} as {to}") from exc

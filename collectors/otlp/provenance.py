"""Provenance records arrive as OTLP log records with event name ``aiops.provenance``; they
leave the logs stream here and become entries of the hash-chained ``provenance`` table."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from aiops.ledger import PROVENANCE_EVENT

__all__ = ["PROVENANCE_EVENT", "split_provenance"]
_FIELDS = ("model", "version", "artifact_digest", "input_hash", "hardware", "inference_id")


def split_provenance(logs: pa.Table) -> tuple[pa.Table, list[dict[str, Any]]]:
    """(the log records that are not provenance, the provenance entries in arrival order)."""
    if logs.num_rows == 0:
        return logs, []
    is_prov = pc.fill_null(pc.equal(logs.column("event_name"), PROVENANCE_EVENT), False)
    if not pc.any(is_prov).as_py():
        return logs, []
    records = logs.filter(is_prov)
    entries = []
    times = records.column("time").cast(pa.int64()).to_pylist()
    for i, attributes in enumerate(records.column("attributes").to_pylist()):
        attrs = json.loads(attributes or "{}")
        entry: dict[str, Any] = {k: attrs.get(k) for k in _FIELDS}
        entry["time"] = times[i]
        entry["trace_id"] = records.column("trace_id")[i].as_py()
        entries.append(entry)
    return logs.filter(pc.invert(is_prov)), entries

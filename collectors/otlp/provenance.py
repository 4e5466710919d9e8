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


# Longest value of a provenance field: digests are 64 hex digits, names and versions short.
MAX_FIELD_CHARS = 512


def split_provenance(logs: pa.Table) -> tuple[pa.Table, list[dict[str, Any]], list[str]]:
    """(the log records that are not provenance, the valid provenance entries in arrival
    order, one reason per malformed record left out).

    Each field is a string (or absent) of at most ``MAX_FIELD_CHARS``, and the record has a
    time: a record that says otherwise is rejected alone, and never reaches the chain.
    """
    if logs.num_rows == 0:
        return logs, [], []
    is_prov = pc.fill_null(pc.equal(logs.column("event_name"), PROVENANCE_EVENT), False)
    if not pc.any(is_prov).as_py():
        return logs, [], []
    records = logs.filter(is_prov)
    entries, problems = [], []
    times = records.column("time").cast(pa.int64()).to_pylist()
    for i, attributes in enumerate(records.column("attributes").to_pylist()):
        try:
            attrs = json.loads(attributes or "{}")
        except ValueError:
            attrs = None
        entry: dict[str, Any] = {k: attrs.get(k) for k in _FIELDS} \
            if isinstance(attrs, dict) else {}
        entry["time"] = times[i]
        entry["trace_id"] = records.column("trace_id")[i].as_py()
        problem = _problem(entry) if isinstance(attrs, dict) else "attributes are not a map"
        if problem:
            problems.append(f"provenance record {i}: {problem}")
        else:
            entries.append(entry)
    return logs.filter(pc.invert(is_prov)), entries, problems


def _problem(entry: dict[str, Any]) -> str:
    if entry["time"] is None:
        return "no time"
    for k in (*_FIELDS, "trace_id"):
        v = entry.get(k)
        if v is not None and not isinstance(v, str):
            return f"{k} must be a string, not {type(v).__name__}"
        if isinstance(v, str) and len(v) > MAX_FIELD_CHARS:
            return f"{k} is longer than {MAX_FIELD_CHARS} characters"
    return ""

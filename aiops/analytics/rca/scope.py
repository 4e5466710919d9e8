"""Where the ranker reads from (a Store or a DuckDB connection) and the SQL that places a row
in the anomaly window, a baseline window or neither, and names its candidate entity."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from aiops.analytics.rca.model import Window
from aiops.store import Store


class Db(Protocol):
    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...

    def arrow(self, sql: str) -> pa.Table: ...


class StoreDb:
    def __init__(self, store: Store) -> None:
        self._store = store

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._store.query(sql).rows

    def arrow(self, sql: str) -> pa.Table:
        return self._store.query_arrow(sql)


class ConnDb:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._con.execute(sql).fetchall()

    def arrow(self, sql: str) -> pa.Table:
        return self._con.sql(sql).to_arrow_table()



_ATTR = re.compile(r"^[A-Za-z0-9_.\-]+$")


def entity_sql(attr: str) -> str:
    """SQL for the candidate a row belongs to: ``service.name`` is a column; any other
    attribute is looked up among the resource's attributes, then the row's own (where the
    serving code puts e.g. ``aiops.model.version``)."""
    if attr == "service.name":
        return "service_name"
    if not _ATTR.match(attr):
        raise ValueError(f"not an attribute name: {attr!r}")
    path = f"'$.\"{attr}\"'"
    return (f"coalesce(json_extract_string(resource_attributes, {path}), "
            f"json_extract_string(attributes, {path}))")


def lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Bucket of anomaly-window counts; baseline buckets are epoch minutes.
ANOM = -1
MINUTE_NS = 60_000_000_000
# The event after the last one of a sequence (a span's calls, a span's log records).
END = "<end>"


@dataclass(frozen=True)
class Scope:
    """The anomaly window, the baseline windows, and ``peers``: the anomaly windows of the same
    system's other incidents (what moves in every incident, e.g. with the load an incident
    brings, is not this incident's cause)."""

    anomaly: Window
    baseline: list[Window]
    entity: str
    peers: tuple[Window, ...] = ()

    def phase(self, column: str) -> str:
        """SQL: 1 inside the anomaly window, 0 inside a baseline window, else NULL."""
        base = " OR ".join(self._inside(w, column) for w in self.baseline)
        return f"CASE WHEN {self._inside(self.anomaly, column)} THEN 1 WHEN {base} THEN 0 END"

    def piece(self, column: str) -> str:
        """SQL: which window ``column`` falls in (0 = anomaly, 1.. = baseline), else NULL."""
        cases = " ".join(f"WHEN {self._inside(w, column)} THEN {i}"
                         for i, w in enumerate([self.anomaly, *self.baseline]))
        return f"CASE {cases} END"

    @staticmethod
    def _inside(w: Window, column: str) -> str:
        return (f"({column} >= make_timestamp_ns({w.start_ns}) AND "
                f"{column} < make_timestamp_ns({w.end_ns}))")

    def peer(self, column: str) -> str:
        """SQL: which peer window ``column`` falls in (0..), else NULL."""
        if not self.peers:
            return "NULL"
        cases = " ".join(f"WHEN {self._inside(w, column)} THEN {i}"
                         for i, w in enumerate(self.peers))
        return f"CASE {cases} END"

    def bucket(self, column: str) -> str:
        """SQL: ANOM in the anomaly window, the epoch minute in a baseline window."""
        return (f"CASE WHEN {self.phase(column)} = 1 THEN {ANOM} "
                f"ELSE epoch_ns({column}) // {MINUTE_NS} END")

    def bounds(self, column: str) -> str:
        lo = min(w.start_ns for w in [self.anomaly, *self.baseline, *self.peers])
        hi = max(w.end_ns for w in [self.anomaly, *self.baseline, *self.peers])
        return (f"{column} >= make_timestamp_ns({lo}) AND "
                f"{column} < make_timestamp_ns({hi})")

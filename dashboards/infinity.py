"""Queries of the Infinity datasource (``yesoreyeram-infinity-datasource``) against the aiops
server's JSON API, as grafana-foundation-sdk builders (the SDK ships no Infinity types).

Two shapes: ``Infinity.get(path, root)`` reads a JSON endpoint whose rows sit under ``root``
(``/api/v1/incidents`` -> ``incidents``), and ``Infinity.sql(sql, columns)`` posts one
read-only statement to ``/api/v1/sql``. That endpoint answers ``{"columns", "rows"}`` with each
row an array, so the root selector (JSONata, Infinity's backend parser) turns rows into
objects keyed by the declared columns. Time bounds travel as the first two parameters,
``${__from}`` and ``${__to}`` (epoch milliseconds), interpolated by Grafana.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as model

from dashboards.datasources import INFINITY

__all__ = ["SQL_PATH", "TIME_PARAMS", "Column", "Infinity", "InfinityQuery", "all_servers",
           "rows_selector"]

SQL_PATH = "/api/v1/sql"
# Interpolated by Grafana into the request body (epoch milliseconds of the dashboard range).
TIME_PARAMS = ["${__from}", "${__to}"]


# The telemetry tables a panel reads: this server's, or (``all_servers``) ``<table>_all``,
# which with a lake (docs/scaling.md) reads every server's rows.
_TELEMETRY = re.compile(r"\b(FROM|JOIN)\s+(spans|logs|metric_points)\b(?!_)")
_ALL_SERVERS: ContextVar[bool] = ContextVar("all_servers", default=False)


@contextlib.contextmanager
def all_servers(on: bool = True) -> Iterator[None]:
    """Panels built inside read ``<table>_all`` instead of ``<table>``."""
    token = _ALL_SERVERS.set(on)
    try:
        yield
    finally:
        _ALL_SERVERS.reset(token)


@dataclass(frozen=True)
class Column:
    """A column Infinity reads: its name in the row object and its Infinity type (``string``,
    ``number``, ``timestamp`` for ISO text, ``timestamp_epoch`` for epoch milliseconds)."""

    name: str
    type: str = "string"

    def to_json(self) -> dict[str, str]:
        return {"selector": self.name, "text": self.name, "type": self.type}


def rows_selector(columns: list[Column]) -> str:
    """JSONata turning ``{"columns": [...], "rows": [[...], ...]}`` into row objects; column
    order is the SELECT's order."""
    fields = ", ".join(f'"{c.name}": $r[{i}]' for i, c in enumerate(columns))
    # The array constructor keeps a one-row answer an array (JSONata unwraps singletons).
    return f"[$map(rows, function($r) {{ {{{fields}}} }})]"


class InfinityQuery(cogvariants.Dataquery):
    """The query object Grafana stores for the Infinity datasource."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


class Infinity(cogbuilder.Builder[cogvariants.Dataquery]):
    """Builder of one Infinity query (``Infinity.get`` or ``Infinity.sql``)."""

    def __init__(self, url: str, root: str, columns: list[Column],
                 body: dict[str, Any] | None = None) -> None:
        self._fields: dict[str, Any] = {
            "refId": "A",
            "datasource": {"type": INFINITY.type_val, "uid": INFINITY.uid},
            "type": "json", "source": "url", "parser": "backend", "format": "table",
            "url": url, "root_selector": root,
            "columns": [c.to_json() for c in columns],
            "url_options": {"method": "GET", "data": ""},
            "filters": [], "computed_columns": [],
        }
        if body is not None:
            # Raw JSON text: Grafana interpolates ${__from}/${__to} in it before sending,
            # which is why those two are written unquoted into the params list.
            text = json.dumps(body, separators=(",", ":"))
            for param in TIME_PARAMS:
                text = text.replace(json.dumps(param), param)
            self._fields["url_options"] = {
                "method": "POST", "body_type": "raw", "body_content_type": "application/json",
                "data": text}

    @classmethod
    def get(cls, path: str, root: str, columns: list[Column]) -> Infinity:
        return cls(path, root, columns)

    @classmethod
    def sql(cls, sql: str, columns: list[Column], params: list[Any] | None = None,
            timed: bool = True) -> Infinity:
        """A statement whose first two ``?`` are the range's start and end (epoch ms) when
        ``timed``; ``params`` follow them."""
        all_params = [*(TIME_PARAMS if timed else []), *(params or [])]
        if _ALL_SERVERS.get():
            sql = _TELEMETRY.sub(r"\1 \2_all", sql)
        return cls(SQL_PATH, rows_selector(columns), columns,
                   {"sql": " ".join(sql.split()), "params": all_params})

    def timeseries(self) -> Self:
        self._fields["format"] = "timeseries"
        return self

    def ref_id(self, ref_id: str) -> Self:
        self._fields["refId"] = ref_id
        return self

    def build(self) -> InfinityQuery:
        return InfinityQuery(self._fields)

    def fields(self) -> dict[str, Any]:
        return dict(self._fields)


class InfinityAnnotation(cogbuilder.Builder[model.AnnotationTarget]):
    """An annotation query's target: the Infinity query itself (the SDK's AnnotationTarget
    only knows Grafana's built-in annotation fields)."""

    def __init__(self, query: Infinity) -> None:
        self.query = query

    def build(self) -> model.AnnotationTarget:
        return _RawTarget(self.query.fields())


class _RawTarget(model.AnnotationTarget):
    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.fields = fields

    def to_json(self) -> dict[str, object]:
        return dict(self.fields)

"""What SQL from outside the process (the HTTP API, Grafana, the agent) may say.

The read path does not trust this check alone: every such query also runs in a DuckDB
``READ ONLY`` transaction, so the engine itself refuses any write to the database, whatever
the statement turned out to be (see ``Store.query_untrusted``). This module narrows what a
statement may *read*: only one SELECT (``EXPLAIN`` of one, ``DESCRIBE``, ``SUMMARIZE``), over
the store's own tables and views and its CTEs, calling only table functions that generate
values, and no function that reads files, settings or the environment or changes state. A
statement that writes is refused wherever it sits, also as the body of a CTE (DuckDB accepts
``WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x``, and ``COPY ... TO`` there writes a
file, which the read-only transaction does not stop).

The statement is parsed by DuckDB itself (``json_serialize_sql``, which serialises SELECT
statements only), and its whole syntax tree is walked: a file path used as a table name, a
table function in a subquery or a settings view reached through a CTE are all found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiops.errors import QueryRejected

__all__ = ["ALLOWED_TABLE_FUNCTIONS", "DENIED_FUNCTIONS", "READ_QUERY_NODES", "Catalog",
           "check"]

# Table functions that only generate values from their arguments.
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "json_each", "json_tree", "repeat_row",
})
# Scalar functions that read the engine's settings, the environment or files, or change
# state; together with any name that starts with one of DENIED_PREFIXES.
DENIED_FUNCTIONS = frozenset({
    "current_setting", "getenv", "checkpoint", "force_checkpoint", "nextval", "currval",
    "setseed", "query", "query_table", "sql_auto_complete", "which_secret", "enable_logging",
    "disable_logging", "truncate_duckdb_logs", "set_variable",
})
DENIED_PREFIXES = ("read_", "duckdb_", "pragma_", "parquet_", "iceberg_", "delta_")
# The query nodes a read consists of. DuckDB's parser also accepts INSERT, UPDATE, DELETE and
# COPY TO as the body of a CTE (``WITH x AS (DELETE ... RETURNING *) SELECT ...``, serialised
# as ``DELETE_QUERY_NODE`` and so on); any node type not listed here is refused, so a kind of
# node a later DuckDB adds is refused too until it is looked at.
READ_QUERY_NODES = frozenset({
    "SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
# Schemas other than ``main`` a query may read: the standard catalog description only.
READABLE_SCHEMAS = frozenset({"information_schema"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)
_ANALYZE = re.compile(r"^\s*ANALY[SZ]E\b", re.IGNORECASE)


@dataclass(frozen=True)
class Catalog:
    """The names a query may use as tables (the store's own) and the ones it may not (the
    engine's catalog views such as ``pg_settings``, which a bare name would reach)."""

    tables: frozenset[str]
    reserved: frozenset[str]


def check(sql: str, serialize: Callable[[str], str], catalog: Catalog) -> None:
    """Raise ``QueryRejected`` with the reason unless ``sql`` is one allowed read.

    ``serialize`` is DuckDB's ``json_serialize_sql`` (the caller runs it on its own cursor).
    """
    explained = _EXPLAIN.match(sql)
    if explained:
        if _ANALYZE.match(explained.group("rest")):
            raise QueryRejected("EXPLAIN ANALYZE runs the statement: use EXPLAIN")
        sql = explained.group("rest")
    doc = json.loads(serialize(sql))
    if doc.get("error"):
        message = str(doc.get("error_message", "cannot parse the query"))
        if "Only SELECT" in message:
            raise QueryRejected("only SELECT queries (or EXPLAIN, DESCRIBE, SUMMARIZE of one) "
                                "are allowed here")
        raise QueryRejected(f"cannot parse the query: {message}")
    statements = doc.get("statements", [])
    if len(statements) != 1:
        raise QueryRejected(f"expected exactly one statement, got {len(statements)}")
    ctes = {name for node in _walk(statements[0]) for name in _cte_names(node)}
    for node in _walk(statements[0]):
        _check_node(node, ctes, catalog)


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _cte_names(node: dict[str, Any]) -> Iterator[str]:
    cte_map = node.get("cte_map")
    if isinstance(cte_map, dict):
        for entry in cte_map.get("map", []):
            yield str(entry.get("key", "")).lower()


def _check_node(node: dict[str, Any], ctes: set[str], catalog: Catalog) -> None:
    kind, cls = node.get("type"), node.get("class")
    if isinstance(kind, str) and kind.endswith("_NODE") and kind not in READ_QUERY_NODES:
        verb = kind.removesuffix("_NODE").removesuffix("_QUERY").replace("_", " ")
        raise QueryRejected(f"{verb} is not allowed here, also not inside a WITH clause or "
                            "subquery: this path only reads")
    if node.get("info_type") == "COPY_INFO":
        raise QueryRejected("COPY is not allowed here, also not inside a WITH clause")
    if kind == "TABLE_FUNCTION":
        fn = node.get("function") or {}
        name = str(fn.get("function_name", "")).lower()
        if name not in ALLOWED_TABLE_FUNCTIONS or fn.get("schema") or fn.get("catalog"):
            raise QueryRejected(f"table function {name or '?'}() is not allowed here; allowed: "
                                f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}")
    elif cls == "FUNCTION" or kind == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES):
            raise QueryRejected(f"function {name}() is not allowed here")
        if node.get("catalog") or (node.get("schema") or "main") != "main":
            raise QueryRejected(f"qualified function {node.get('schema')}.{name}() is not "
                                "allowed here")
    elif kind in ("BASE_TABLE", "SHOW_REF"):
        _check_table(node, ctes, catalog)


def _check_table(node: dict[str, Any], ctes: set[str], catalog: Catalog) -> None:
    name = str(node.get("table_name") or "")
    if node.get("type") == "SHOW_REF" and not name:
        return  # DESCRIBE / SUMMARIZE of a query: the query itself is walked
    schema = str(node.get("schema_name") or "").lower()
    database = str(node.get("catalog_name") or "")
    if database:
        raise QueryRejected(f"{database}.{schema}.{name}: name tables without a database")
    if not _IDENTIFIER.match(name):
        raise QueryRejected("a quoted name is not a table of this store (files and other "
                            "sources cannot be read here)")
    lower = name.lower()
    if schema in READABLE_SCHEMAS:
        return
    if schema not in ("", "main"):
        raise QueryRejected(f"schema {schema!r} is not readable here")
    if lower in catalog.tables or (lower in ctes and lower not in catalog.reserved):
        return
    if lower in catalog.reserved:
        raise QueryRejected(f"{name} is an engine catalog view, not readable here")
    raise QueryRejected(f"no table or view called {name!r}; the tables are: "
                        f"{', '.join(sorted(catalog.tables))}")

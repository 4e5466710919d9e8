"""``POST /api/v1/sql``: read-only SQL for Grafana, the CLI and scripts (viewer role).

Queries run on their own small thread pool, never the one ingest and ``/readyz`` use, with a
fixed number of slots: a query that finds none gets a retryable 429 at once instead of
queueing. Each is interrupted after ``sql_timeout_s`` and stopped at ``sql_max_result_bytes``
(``Store.query_untrusted``), so a slot is always given back; closing the pool interrupts
the ones still running, so shutdown never waits on a query.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder
from fastapi.params import Depends
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field

from aiops.config import Settings
from aiops.errors import (
    QueryBusy,
    QueryRejected,
    QueryTimeout,
    ResultTooLarge,
    StoreError,
)
from aiops.store import QueryResult, Store

__all__ = ["SQL_MAX_BODY", "QueryPool", "SqlRequest", "make_router"]

# Largest request body: a statement of 100k characters and its parameters (a list of ids to
# look up can be long).
SQL_MAX_BODY = 8 * 2**20


class SqlRequest(BaseModel):
    """Body of ``POST /api/v1/sql``."""

    sql: str = Field(min_length=1, max_length=100_000, description="One SELECT statement.")
    params: list[Any] = Field(default_factory=list, max_length=1000,
                              description="Values for `?` placeholders.")
    limit: int | None = Field(None, ge=1, description="Row limit (capped by the server's).")


class QueryPool:
    """Runs untrusted queries on ``slots`` threads of its own; a full pool refuses."""

    def __init__(self, store: Store, slots: int, timeout_s: float, max_bytes: int,
                 max_memory_bytes: int | None = None) -> None:
        self.store, self.timeout_s, self.max_bytes = store, timeout_s, max_bytes
        self.max_memory_bytes = max_memory_bytes
        self._slots = threading.BoundedSemaphore(slots)
        self._executor = ThreadPoolExecutor(slots, thread_name_prefix="sql")

    async def run(self, sql: str, params: list[Any], limit: int) -> QueryResult:
        if not self._slots.acquire(blocking=False):
            raise QueryBusy("every SQL slot is busy; retry in a moment")
        try:
            future = self._executor.submit(self.store.query_untrusted, sql, params, limit,
                                           self.timeout_s, self.max_bytes,
                                           self.max_memory_bytes)
        except RuntimeError as exc:  # shut down
            self._slots.release()
            raise StoreError("the server is shutting down") from exc
        future.add_done_callback(lambda _: self._slots.release())
        # A client that leaves does not stop the query early; its timeout does.
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


_STATUS = ((QueryBusy, 429), (QueryTimeout, 408), (ResultTooLarge, 413), (QueryRejected, 400))


def make_router(pool: QueryPool, settings: Settings, viewer: Depends,
                registry: CollectorRegistry) -> APIRouter:
    router = APIRouter()
    queries = Counter("aiops_sql_queries", "Read-only SQL queries by outcome", ["outcome"],
                      registry=registry)

    @router.post("/api/v1/sql", dependencies=[viewer])
    async def sql(body: SqlRequest) -> JSONResponse:
        """Run one read-only query (viewer)."""
        limit = min(body.limit or settings.sql_row_limit, settings.sql_row_limit)
        try:
            result = await pool.run(body.sql, body.params, limit)
        except StoreError as exc:
            # Bad SQL (unknown table, type error) is the caller's to fix: 400 by default.
            code = next((c for kind, c in _STATUS if isinstance(exc, kind)), 400)
            queries.labels({429: "busy", 408: "timeout", 413: "too_large",
                            400: "rejected"}[code]).inc()
            headers = {"Retry-After": "1"} if code == 429 else None
            return JSONResponse({"error": str(exc)}, status_code=code, headers=headers)
        queries.labels("ok").inc()
        return JSONResponse(jsonable_encoder({
            "columns": result.columns, "types": result.types,
            "rows": [list(r) for r in result.rows], "truncated": result.truncated,
        }))

    return router

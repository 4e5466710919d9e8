"""The aiops server: one process that owns the DuckDB file.

Routes: ``/healthz`` (alive), ``/readyz`` (store usable), ``/metrics`` (its own Prometheus
metrics), the OTLP/HTTP receiver (``/v1/traces|logs|metrics``) and the read-only SQL API
(``POST /api/v1/sql``). ``create_app`` takes its dependencies so tests pass real ones.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from pydantic import BaseModel, Field

from aiops.config import Settings
from aiops.errors import AIOpsError, QueryRejected, StoreError
from aiops.ledger import verify_table
from aiops.retention import Retention
from aiops.store import Store
from collectors.otlp.receiver import ReceiverMetrics, make_router
from collectors.otlp.writer import BatchWriter, MemoryBudget
from collectors.prometheus import Scraper, parse_targets

__all__ = ["SqlRequest", "create_app"]

log = logging.getLogger(__name__)


class SqlRequest(BaseModel):
    """Body of ``POST /api/v1/sql``."""

    sql: str = Field(min_length=1, max_length=100_000, description="One SELECT statement.")
    params: list[Any] = Field(default_factory=list, max_length=1000,
                              description="Values for `?` placeholders.")
    limit: int | None = Field(None, ge=1, description="Row limit (capped by the server's).")


def create_app(settings: Settings, store: Store) -> FastAPI:
    """Build the server app around an open store (the caller owns and closes it)."""
    registry = CollectorRegistry()
    receiver_metrics = ReceiverMetrics.create(registry)
    sql_queries = Counter("aiops_sql_queries", "Read-only SQL queries by outcome", ["outcome"],
                          registry=registry)
    writer = BatchWriter(store)
    budget = MemoryBudget(settings.ingest_memory_mb * 2**20)

    targets = (parse_targets(f"ray=http://127.0.0.1:{settings.ray_metrics_port}/metrics")
               if settings.scrape_targets == "ray" else parse_targets(settings.scrape_targets))
    scraper = Scraper(targets, settings.scrape_interval_s,
                      lambda t: store.append("metric_points", t)) if targets else None

    retention = Retention(store, settings.retention_hours, settings.retention_interval_s) \
        if settings.retention_hours else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if scraper is not None:
            scraper.start()
        if retention is not None:
            retention.start()
        yield
        if retention is not None:
            retention.close()
        if scraper is not None:
            scraper.close()
        writer.close()  # commit what is queued before the store closes

    app = FastAPI(title="aiops server", version="0.1.0", lifespan=lifespan)
    app.state.writer, app.state.budget = writer, budget
    app.include_router(make_router(writer, budget, settings.max_body_bytes, receiver_metrics))
    Gauge("aiops_ingest_buffer_bytes", "Bytes of request bodies and decoded batches in "
          "flight", registry=registry).set_function(lambda: budget.used)
    Gauge("aiops_ingest_buffer_peak_bytes", "Most bytes ever in flight",
          registry=registry).set_function(lambda: budget.peak)
    Gauge("aiops_ingest_group_commits", "Group commits so far",
          registry=registry).set_function(lambda: writer.commits)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=400)

    @app.exception_handler(AIOpsError)
    async def _aiops_error(request: Request, exc: AIOpsError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=500)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        try:
            await run_in_threadpool(store.ping)
        except StoreError as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready", "schema_version": store.schema_version})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/ledger/{table_name}/verify")
    async def verify_ledger(table_name: str) -> JSONResponse:
        try:
            report = await run_in_threadpool(verify_table, store, table_name)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse(report)

    @app.post("/api/v1/sql")
    async def sql(body: SqlRequest) -> JSONResponse:
        limit = min(body.limit or settings.sql_row_limit, settings.sql_row_limit)
        try:
            result = await run_in_threadpool(store.query, body.sql, body.params, limit)
        except QueryRejected as exc:
            sql_queries.labels("rejected").inc()
            return JSONResponse({"error": str(exc)}, status_code=400)
        except StoreError as exc:
            # Bad SQL (unknown table, type error) is the caller's to fix.
            sql_queries.labels("failed").inc()
            return JSONResponse({"error": str(exc)}, status_code=400)
        sql_queries.labels("ok").inc()
        return JSONResponse(jsonable_encoder({
            "columns": result.columns, "types": result.types,
            "rows": [list(r) for r in result.rows], "truncated": result.truncated,
        }))

    return app

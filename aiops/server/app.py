"""The aiops server: one process that owns the DuckDB file.

Routes: ``/healthz`` (alive), ``/readyz`` (store usable), ``/metrics`` (its own Prometheus
metrics), ``/metrics/otlp`` (the OTLP metrics in the store, for Prometheus), the OTLP/HTTP
receiver (``/v1/traces|logs|metrics``) and the read-only SQL API
(``POST /api/v1/sql``), incidents and actions, and chat-ops
(``POST /v1/chatops``, the Slack slash command ``POST /v1/slack/command``).
``create_app`` takes its dependencies so tests pass real ones.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import FastAPI, HTTPException, Request
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
from pydantic import BaseModel, Field, field_validator

from agents.chatops import AgentService
from agents.chatops import make_router as chatops_router
from aiops.analytics.engine import Analyzer, AnalyzerConfig, objectives_from_specs
from aiops.analytics.slo import parse_windows
from aiops.analytics.traces import TraceThresholds
from aiops.config import Settings
from aiops.errors import AIOpsError, QueryRejected, StackError, StoreError
from aiops.ledger import verify_table
from aiops.lifecycle import LifecycleClient, admin_token
from aiops.remediation.policy import load_policy
from aiops.remediation.remediator import Remediator
from aiops.remediation.rollout import DEFAULT_STEPS, Rollout
from aiops.retention import Retention
from aiops.server.exposition import StoreCollector
from aiops.store import Store
from collectors.otlp.receiver import ReceiverMetrics, make_router
from collectors.otlp.writer import BatchWriter, MemoryBudget
from collectors.prometheus import Scraper, parse_targets

__all__ = ["SqlRequest", "create_app"]

log = logging.getLogger(__name__)


class RolloutRequest(BaseModel):
    """Body of ``POST /api/v1/rollouts``."""

    model: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=100)
    steps: list[int] = Field(default_factory=lambda: list(DEFAULT_STEPS), min_length=1,
                             max_length=20, description="Canary percentages, rising, to 100.")
    step_s: float = Field(60.0, ge=2, le=3600, description="Seconds each step is observed.")

    @field_validator("steps")
    @classmethod
    def _rising_to_100(cls, steps: list[int]) -> list[int]:
        if any(not 1 <= p <= 100 for p in steps) or steps != sorted(set(steps)) \
                or steps[-1] != 100:
            raise ValueError("steps must rise strictly within 1..100 and end at 100")
        return steps


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

    remediator = Remediator(store, load_policy(settings.policy_file),
                            lambda: LifecycleClient.from_settings(settings))
    analyzer = _analyzer(settings, store, remediator) if settings.analytics else None

    tracker = analyzer.tracker if analyzer is not None else None
    agents = AgentService(
        settings, store,
        lambda action, actor, now_ns: remediator.propose(action, actor, now_ns, tracker),
        lambda action_id, approve, actor, now_ns: remediator.decide_pending(
            action_id, approve, actor, now_ns, tracker))

    def is_admin(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        try:
            return given.lower().startswith("bearer ") and \
                secrets.compare_digest(given[7:].strip(), admin_token(settings))
        except StackError:
            return False

    def require_token(request: Request) -> None:
        """Mutating endpoints want the admin token (the control plane's): 401 without one,
        403 with a wrong one."""
        given = request.headers.get("authorization", "")
        if not given.lower().startswith("bearer "):
            raise HTTPException(401, "this endpoint needs the admin token: "
                                "'Authorization: Bearer <token>' (<data_dir>/admin.token)")
        try:
            expected = admin_token(settings)
        except StackError as exc:
            raise HTTPException(503, str(exc)) from exc
        if not secrets.compare_digest(given[7:].strip(), expected):
            raise HTTPException(403, "wrong admin token")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if scraper is not None:
            scraper.start()
        if retention is not None:
            retention.start()
        if analyzer is not None:
            analyzer.start()
        yield
        if analyzer is not None:
            analyzer.close()
        if retention is not None:
            retention.close()
        if scraper is not None:
            scraper.close()
        writer.close()  # commit what is queued before the store closes

    app = FastAPI(title="aiops server", version="0.1.0", lifespan=lifespan)
    app.state.writer, app.state.budget = writer, budget
    app.include_router(make_router(writer, budget, settings.max_body_bytes, receiver_metrics))
    app.include_router(chatops_router(agents, is_admin))
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

    # Serving metrics arrive as OTLP and live in DuckDB: re-exposed here for Prometheus.
    otlp_registry = CollectorRegistry()
    otlp_registry.register(StoreCollector(store))

    @app.get("/metrics/otlp")
    async def otlp_metrics() -> Response:
        body = await run_in_threadpool(generate_latest, otlp_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/incidents")
    async def list_incidents(status: str | None = None, limit: int = 50) -> JSONResponse:
        """Incidents, newest first, in their latest state (``status``: open, mitigating,
        resolved, or ``active`` for open + mitigating)."""
        wanted = {"active": ["open", "mitigating"]}.get(status or "", [status] if status else [])
        if any(w not in ("open", "mitigating", "resolved") for w in wanted):
            return JSONResponse({"error": f"unknown status {status!r}: use open, mitigating, "
                                 "resolved or active"}, status_code=400)
        where = "WHERE status IN (SELECT unnest(?::VARCHAR[]))" if wanted else ""
        result = await run_in_threadpool(
            store.query, f"SELECT * EXCLUDE (evidence) FROM incidents_current {where} "
            "ORDER BY opened_at DESC", [wanted] if wanted else [], max(1, min(limit, 1000)))
        return JSONResponse({"incidents": [_jsonable(dict(zip(result.columns, r,
                                                               strict=True)))
                                           for r in result.rows]})

    @app.get("/api/v1/incidents/{incident_id}")
    async def get_incident(incident_id: str) -> JSONResponse:
        """One incident's latest state with its evidence (root causes, findings, context)."""
        result = await run_in_threadpool(
            store.query, "SELECT * FROM incidents_current WHERE incident_id = ?", [incident_id])
        if not result.rows:
            return JSONResponse({"error": f"no incident {incident_id!r}"}, status_code=404)
        row = _jsonable(dict(zip(result.columns, result.rows[0], strict=True)))
        row["evidence"] = json.loads(row["evidence"] or "{}")
        return JSONResponse(row)

    @app.get("/api/v1/actions")
    async def list_actions(status: str | None = None, limit: int = 100) -> JSONResponse:
        """Remediation actions in their latest state, newest first (``status=pending`` for
        the ones waiting for an approver)."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        result = await run_in_threadpool(
            store.query, f"SELECT * FROM actions_current {where} ORDER BY created_at DESC",
            params, max(1, min(limit, 1000)))
        rows = [_jsonable(dict(zip(result.columns, r, strict=True))) for r in result.rows]
        for r in rows:
            r["params"], r["outcome"] = json.loads(r["params"] or "{}"), \
                json.loads(r["outcome"] or "{}")
        return JSONResponse({"actions": rows})

    @app.post("/api/v1/actions/{action_id}/{verdict}")
    async def decide_action(action_id: str, verdict: str, request: Request) -> JSONResponse:
        """Approve or deny a pending action (admin token)."""
        require_token(request)
        if verdict not in ("approve", "deny"):
            return JSONResponse({"error": f"unknown verdict {verdict!r}: approve or deny"},
                                status_code=404)
        who = request.headers.get("x-aiops-user", "api")
        tracker = analyzer.tracker if analyzer is not None else None
        try:
            result = await run_in_threadpool(remediator.decide_pending, action_id,
                                             verdict == "approve", f"user:{who}",
                                             time.time_ns(), tracker)
        except KeyError:
            return JSONResponse({"error": f"no action {action_id!r}"}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse(result)

    rollouts: dict[str, Rollout] = {}

    @app.post("/api/v1/rollouts")
    async def start_rollout(body: RolloutRequest, request: Request) -> JSONResponse:
        """A progressive canary of an applied version (admin token): each step's SLIs are
        compared with the stable version's; a breach proposes a rollback to the policy."""
        require_token(request)
        busy = [r for r in rollouts.values() if r.model == body.model
                and r.status in ("pending", "running")]
        if busy:
            return JSONResponse({"error": f"{body.model} is already being rolled out "
                                 f"({busy[0].rollout_id})"}, status_code=409)
        rollout = Rollout(body.model, body.version, store,
                          lambda: LifecycleClient.from_settings(settings),
                          lambda a, actor, now: remediator.propose(a, actor, now, tracker),
                          tuple(body.steps), body.step_s)
        rollouts[rollout.rollout_id] = rollout
        rollout.start()
        return JSONResponse(rollout.describe(), status_code=202)

    @app.get("/api/v1/rollouts")
    async def list_rollouts() -> JSONResponse:
        return JSONResponse({"rollouts": [r.describe() for r in rollouts.values()]})

    @app.get("/api/v1/rollouts/{rollout_id}")
    async def get_rollout(rollout_id: str) -> JSONResponse:
        r = rollouts.get(rollout_id)
        if r is None:
            return JSONResponse({"error": f"no rollout {rollout_id!r}"}, status_code=404)
        return JSONResponse(r.describe())

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


def _analyzer(settings: Settings, store: Store, remediator: Remediator) -> Analyzer:
    traces = TraceThresholds(window_s=settings.analytics_window_s)
    config = AnalyzerConfig(
        interval_s=settings.analytics_interval_s,
        windows=tuple(parse_windows(settings.analytics_burn_windows)), traces=traces,
        resolve_after_s=settings.analytics_resolve_after_s,
        objectives=objectives_from_specs(settings.models_file))
    return Analyzer(store, config, on_round=remediator.on_round)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}

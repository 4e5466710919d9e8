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
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from pydantic import BaseModel, Field, field_validator

from agents.chatops import SLACK_MAX_BODY, AgentService
from agents.chatops import make_router as chatops_router
from agents.memory import LazyMemory
from agents.settings import AgentSettings, SlackSettings
from aiops.admission import ConnectionGate, PrincipalSlots
from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.incidents import IncidentEvidence, IncidentTracker
from aiops.analytics.slo import parse_windows
from aiops.analytics.topology import load_service_map
from aiops.analytics.traces import TraceThresholds
from aiops.attach.control import Planes
from aiops.attach.watch import Attachment, AttachSettings, targets_of
from aiops.auth import Authenticator
from aiops.config import Settings
from aiops.errors import AIOpsError, ConfigError, StoreError
from aiops.lake_sync import LakeSync
from aiops.ledger import verify_table
from aiops.lifecycle import LifecycleClient
from aiops.periodic import Components, PeriodicMetrics
from aiops.remediation.policy import load_policy
from aiops.remediation.remediator import Remediator
from aiops.remediation.rollout import DEFAULT_STEPS, Rollout
from aiops.remediation.worker import RoundWorker
from aiops.retention import Retention
from aiops.server.connections import connection_gate
from aiops.server.exposition import SharedScrape, StoreCollector
from aiops.server.gate import BodyLimits, Gate, allowed_hosts, route_access_of
from aiops.server.guard import Guards
from aiops.server.singleflight import SingleFlight
from aiops.server.sql import SQL_MAX_BODY, QueryPool
from aiops.server.sql import make_router as sql_router
from aiops.store import Store
from collectors.otlp.grpc_receiver import GrpcOptions, GrpcReceiver
from collectors.otlp.receiver import ReceiverMetrics, make_router
from collectors.otlp.writer import BatchWriter, MemoryBudget
from collectors.prometheus import Scraper, Target, parse_targets
from collectors.remote_write import make_router as remote_write_router
from serve.specs import capacities_from_specs, models_from_specs, objectives_from_specs

__all__ = ["create_app"]

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


def _grpc_receiver(settings: Settings, writer: BatchWriter, budget: MemoryBudget,
                   authenticator: Authenticator, metrics: ReceiverMetrics,
                   refused: Callable[[str], None], slots: PrincipalSlots,
                   connections: ConnectionGate) -> GrpcReceiver | None:
    """OTLP/gRPC beside OTLP/HTTP: same host, tokens, message cap and TLS."""
    if not settings.otlp_grpc_port:
        return None
    tls = None
    if settings.server_tls_cert is not None and settings.server_tls_key is not None:
        tls = (settings.server_tls_key.read_bytes(), settings.server_tls_cert.read_bytes())
    return GrpcReceiver(GrpcOptions(settings.server_host, settings.otlp_grpc_port,
                                    settings.max_body_bytes, tls,
                                    max_connections=settings.server_max_connections,
                                    read_timeout_s=settings.ingest_read_timeout_s),
                        writer, budget, authenticator, metrics, refused, slots, connections)


def create_app(settings: Settings, store: Store,
               authenticator: Authenticator | None = None) -> FastAPI:
    """Build the server app around an open store (the caller owns and closes it).

    Every route declares what it needs (``guards(...)``): public (health only), ingest
    (OTLP), viewer, operator or admin, or a Slack signature; see docs/security.md.
    """
    guards = Guards(authenticator or Authenticator.from_settings(settings))
    registry = CollectorRegistry()
    periodic = PeriodicMetrics(registry)  # every background loop's runs and failure streak
    receiver_metrics = ReceiverMetrics.create(registry)
    pool = QueryPool(store, settings.sql_max_concurrent, settings.sql_timeout_s,
                     settings.sql_max_result_bytes, settings.sql_max_memory_mb * 2**20)
    writer = BatchWriter(store)
    budget = MemoryBudget(settings.ingest_memory_mb * 2**20)

    # The embedded stack's Ray metrics are scraped (and its control plane called) only where
    # that stack is expected: not on a server that only watches serving it did not start.
    local_ray = parse_targets(f"ray=http://127.0.0.1:{settings.ray_metrics_port}/metrics")
    targets = [] if settings.scrape_targets == "ray" else parse_targets(settings.scrape_targets)

    def scraped(attached: list[Target]) -> list[Target]:
        embedded = settings.scrape_targets == "ray" and _embedded(settings)
        return [*(local_ray if embedded else targets), *attached]

    scraper = Scraper(scraped([]), settings.scrape_interval_s,
                      lambda t: store.append("metric_points", t), metrics=periodic)

    retention = Retention(store, settings.retention_hours, settings.retention_interval_s,
                          metrics=periodic) if settings.retention_hours else None
    lake = LakeSync(store, settings.lake_commit_interval_s, settings.lake_upkeep_interval_s,
                    registry, metrics=periodic) if store.lake is not None else None

    # Serving aiops did not start (docs/attach.md): read in the background; its control
    # planes join the embedded stack's behind one ControlPlane.
    declared = load_service_map(settings.service_map_file)
    attachment = Attachment(AttachSettings.of(settings), lambda: _troubled(tracker),
                            lambda extra: scraper.set_targets(scraped(extra)),
                            lambda graph: analyzer.set_calls(declared | graph)
                            if analyzer is not None else None, metrics=periodic)
    # Resolved incidents, embedded: "seen before" in answers and in the planner's reasons.
    memory = LazyMemory(settings.data_dir / "memory.duckdb")
    remediator = Remediator(store, load_policy(settings.policy_file), lambda: Planes(
        [*([lambda: LifecycleClient.from_settings(settings)] if _embedded(settings) else []),
         *attachment.planes()]),
        # Not waiting: the first plan starts the memory loading instead of stalling a round.
        recall=lambda incident_id: memory.seen_before(store, incident_id, wait=False))
    analyzer = _analyzer(settings, store, periodic) if settings.analytics else None
    tracker = analyzer.tracker if analyzer is not None else None
    # Remediation on a thread of its own: a round hands its incidents over and goes on, so
    # no detection round waits on a control plane (aiops.remediation.worker).
    rounds = RoundWorker(remediator.on_round)
    if tracker is not None:
        remediator.attach(tracker, rounds.submit)  # marks incidents mitigating there
    agents = AgentService(
        AgentSettings.of(settings), store, remediator.propose, remediator.decide_pending,
        objectives=analyzer.config.objectives if analyzer is not None else (),
        models=models_from_specs(settings.models_file) if settings.analytics else (),
        memory=memory, slack=SlackSettings.of(settings),
        capacities=capacities_from_specs(settings.models_file) if settings.analytics else (),
        findings=analyzer.tracker.held if analyzer is not None else None)

    refused = Counter("aiops_gate_refused", "Requests refused before their body was read, "
                      "by reason (host, auth, size, slow, busy; connections: at accept, by "
                      "the connection gate)", ["reason"], registry=registry)
    # Connections of every listener counted together (aiops.admission; HTTP's protocol
    # takes it from app.state, gRPC listens behind a relay that asks it).
    connections = connection_gate(settings)
    connections.on_refused = lambda _why: refused.labels("connections").inc()
    # A token's requests in flight, HTTP and gRPC together (aiops.admission).
    slots = PrincipalSlots(settings.server_max_requests_per_token)
    grpc_receiver = _grpc_receiver(settings, writer, budget, guards.authenticator,
                                   receiver_metrics, lambda why: refused.labels(why).inc(),
                                   slots, connections)

    # The background components in start order; they close in reverse: the analyzer and
    # remediation stop before what feeds them, the receivers before the writer commits what
    # is queued, and the lake last, to be handed what it does not hold yet.
    components = Components()
    if lake is not None:
        components.add("lake-sync", lake)
    components.on_close("writer", writer.close)
    if grpc_receiver is not None:
        components.add("otlp-grpc", grpc_receiver)  # fails the start-up when it cannot bind
    components.on_close("memory", memory.close)
    components.add("prometheus-scraper", scraper)
    components.add("attach", attachment)
    if retention is not None:
        components.add("retention", retention)
    components.add("remediation", rounds)
    if analyzer is not None:
        components.add("analyzer", analyzer)
    components.on_close("sql-pool", pool.close)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        components.start()
        try:
            yield
        finally:
            components.close()

    # The API description is served like any other read route (viewer), not by FastAPI's
    # unauthenticated defaults.
    app = FastAPI(title="aiops server", version="0.1.0", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.writer, app.state.budget = writer, budget
    app.state.connections = connections
    app.include_router(make_router(writer, budget, settings.max_body_bytes, receiver_metrics,
                                   read_timeout_s=settings.ingest_read_timeout_s),
                       dependencies=[guards("ingest")])
    app.include_router(remote_write_router(writer, budget, settings.max_body_bytes,
                                           receiver_metrics, settings.remote_write_max_samples),
                       dependencies=[guards("ingest")])
    app.include_router(chatops_router(agents, guards))
    app.include_router(sql_router(pool, settings, guards("viewer"), registry))
    Gauge("aiops_ingest_buffer_bytes", "Bytes of request bodies and decoded batches in "
          "flight", registry=registry).set_function(lambda: budget.used)
    Gauge("aiops_ingest_buffer_peak_bytes", "Most bytes ever in flight",
          registry=registry).set_function(lambda: budget.peak)
    Gauge("aiops_ingest_group_commits", "Group commits so far",
          registry=registry).set_function(lambda: writer.commits)
    if analyzer is not None:
        stats = analyzer.stats
        Gauge("aiops_analytics_rounds", "Analytics rounds so far",
              registry=registry).set_function(lambda: stats.rounds)
        Gauge("aiops_analytics_round_seconds", "Duration of the last analytics round",
              registry=registry).set_function(lambda: stats.last_round_s)
        Gauge("aiops_analytics_round_max_seconds", "Longest analytics round so far",
              registry=registry).set_function(lambda: stats.max_round_s)

    # Outermost: Host, caller and body caps are checked before anything reads the body.
    # Ingest's own receiver answers its limits in OTLP's format, so the gate's are looser.
    app.add_middleware(
        Gate, authenticator=guards.authenticator, access_of=route_access_of(app),
        limits=BodyLimits(ingest=settings.max_body_bytes + 2**16, by_path=(
            ("/api/v1/sql", SQL_MAX_BODY), ("/v1/slack/command", SLACK_MAX_BODY))),
        hosts=allowed_hosts(settings.server_allowed_hosts, settings.server_host,
                            _machine_names()),
        deadline_s=settings.ingest_read_timeout_s + 1,
        on_refused=lambda why: refused.labels(why).inc(), slots=slots)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # One error shape across the API: {"error": ...}, as every other answer here.
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(AIOpsError)
    async def _aiops_error(request: Request, exc: AIOpsError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=500)

    @app.get("/healthz", dependencies=[guards("public")])
    async def healthz() -> JSONResponse:
        # Alive unless the store is broken and cannot be opened again (a liveness probe then
        # restarts the server; the next statement retries the reopen each second).
        if store.broken is not None:
            return JSONResponse({"status": "broken", "error": store.broken}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", dependencies=[guards("public")])
    async def readyz() -> JSONResponse:
        try:
            await run_in_threadpool(store.ping)
        except StoreError as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc)}, status_code=503)
        # Background components failing now (retention, the lake, scraping ...): the store
        # still serves, so ready, with what is failing said (metrics: aiops_component_failing).
        failing = {h.name: {"failures_in_a_row": h.streak, "error": h.last_error}
                   for h in components.health() if h.failing}
        return JSONResponse({"status": "ready", "schema_version": store.schema_version,
                             **({"failing": failing} if failing else {})})

    @app.get("/metrics", dependencies=[guards("viewer")])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # Serving metrics arrive as OTLP and live in DuckDB: re-exposed here for Prometheus.
    otlp_registry = CollectorRegistry()
    otlp_registry.register(StoreCollector(store))

    otlp_scrape = SharedScrape(lambda: generate_latest(otlp_registry))

    @app.get("/metrics/otlp", dependencies=[guards("viewer")])
    async def otlp_metrics() -> Response:
        return Response(await otlp_scrape.get(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/incidents", dependencies=[guards("viewer")])
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

    @app.get("/api/v1/incidents/{incident_id}",
             dependencies=[guards("viewer")])
    async def get_incident(incident_id: str) -> JSONResponse:
        """One incident's latest state with its evidence (root causes, findings, context)."""
        result = await run_in_threadpool(
            store.query, "SELECT * FROM incidents_current WHERE incident_id = ?", [incident_id])
        if not result.rows:
            return JSONResponse({"error": f"no incident {incident_id!r}"}, status_code=404)
        row = _jsonable(dict(zip(result.columns, result.rows[0], strict=True)))
        try:  # the column's typed contract, as every reader of it
            row["evidence"] = IncidentEvidence.parse(row["evidence"]).to_dict()
        except ValueError as exc:
            return JSONResponse({"error": f"incident {incident_id}: unreadable evidence "
                                 f"({exc})"}, status_code=500)
        return JSONResponse(row)

    @app.get("/api/v1/actions", dependencies=[guards("viewer")])
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

    @app.post("/api/v1/actions/{action_id}/{verdict}",
              dependencies=[guards("admin")])
    async def decide_action(action_id: str, verdict: str, request: Request) -> JSONResponse:
        """Approve or deny a pending action (admin token)."""
        if verdict not in ("approve", "deny"):
            return JSONResponse({"error": f"unknown verdict {verdict!r}: approve or deny"},
                                status_code=404)
        principal = request.state.principal
        who = request.headers.get("x-aiops-user", "api")[:64]
        who = f"{principal.name}/{who}" if principal.name != "admin" else who
        try:
            result = await run_in_threadpool(remediator.decide_pending, action_id,
                                             verdict == "approve", f"user:{who}",
                                             time.time_ns())
        except KeyError:
            return JSONResponse({"error": f"no action {action_id!r}"}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse(result)

    rollouts: dict[str, Rollout] = {}

    @app.post("/api/v1/rollouts", dependencies=[guards("admin")])
    async def start_rollout(body: RolloutRequest, request: Request) -> JSONResponse:
        """A progressive canary of an applied version (admin token): each step's SLIs are
        compared with the stable version's; a breach proposes a rollback to the policy."""
        busy = [r for r in rollouts.values() if r.model == body.model
                and r.status in ("pending", "running")]
        if busy:
            return JSONResponse({"error": f"{body.model} is already being rolled out "
                                 f"({busy[0].rollout_id})"}, status_code=409)
        rollout = Rollout(body.model, body.version, store,
                          lambda: LifecycleClient.from_settings(settings),
                          remediator.propose,
                          tuple(body.steps), body.step_s)
        rollouts[rollout.rollout_id] = rollout
        rollout.start()
        return JSONResponse(rollout.describe(), status_code=202)

    @app.get("/api/v1/attach", dependencies=[guards("viewer")])
    async def attached() -> JSONResponse:
        """Attached serving as last read: Serve applications (version, status, replicas,
        the healthy versions a rollback can return to) and vLLM servers' models."""
        return JSONResponse(attachment.describe())

    @app.get("/api/v1/rollouts", dependencies=[guards("viewer")])
    async def list_rollouts() -> JSONResponse:
        return JSONResponse({"rollouts": [r.describe() for r in rollouts.values()]})

    @app.get("/api/v1/rollouts/{rollout_id}", dependencies=[guards("viewer")])
    async def get_rollout(rollout_id: str) -> JSONResponse:
        r = rollouts.get(rollout_id)
        if r is None:
            return JSONResponse({"error": f"no rollout {rollout_id!r}"}, status_code=404)
        return JSONResponse(r.describe())

    verifications = SingleFlight()

    @app.get("/api/v1/ledger/{table_name}/verify",
             dependencies=[guards("viewer")])
    async def verify_ledger(table_name: str) -> JSONResponse:
        # One verification per table at a time, shared by every caller meanwhile; a caller
        # waits at most ledger_verify_timeout_s (503: retry, the verification goes on).
        try:
            report = await verifications.run(table_name, verify_table, store, table_name,
                                             timeout_s=settings.ledger_verify_timeout_s)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except TimeoutError:
            return JSONResponse({"error": f"verifying {table_name} takes longer than "
                                 f"{settings.ledger_verify_timeout_s:g} s; it goes on: "
                                 "retry for its result"}, status_code=503,
                                headers={"Retry-After": "5"})
        return JSONResponse(report)

    @app.get("/openapi.json", dependencies=[guards("viewer")], include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", dependencies=[guards("viewer")], include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="aiops server")

    return app


def _machine_names() -> tuple[str, ...]:
    """This machine's own names: a Host header naming them is not a rebinding page's."""
    name = socket.gethostname().lower()
    return (name, socket.getfqdn(name).lower()) if name else ()


def _embedded(settings: Settings) -> bool:
    """Whether the Serve stack of ``aiops up`` is expected beside this server: ``auto`` means
    yes unless it watches attached serving (configured, or added with `aiops attach add`)."""
    if settings.embedded_stack != "auto":
        return settings.embedded_stack == "on"
    try:
        return not targets_of(settings)
    except ConfigError:  # a broken attach file: attach-only was meant
        return False


def _troubled(tracker: IncidentTracker | None) -> set[tuple[str, str]]:
    """(service, version) of every open incident's causes (version "" where a cause names
    none): not healthy, whatever it runs."""
    if tracker is None:
        return set()
    return {(c.entity.service, c.entity.version or "") for inc in tracker.open.values()
            for c in inc.causes}  # the tracker's snapshots: nothing changes under us


def _analyzer(settings: Settings, store: Store, metrics: PeriodicMetrics) -> Analyzer:
    traces = TraceThresholds(window_s=settings.analytics_window_s)
    config = AnalyzerConfig(
        interval_s=settings.analytics_interval_s,
        windows=tuple(parse_windows(settings.analytics_burn_windows)), traces=traces,
        resolve_after_s=settings.analytics_resolve_after_s,
        recovered_after_s=settings.analytics_recovered_after_s,
        objectives=objectives_from_specs(settings.models_file),
        calls=load_service_map(settings.service_map_file) if settings.service_map_file
        else None, own_ports=(settings.server_port,))
    return Analyzer(store, config, metrics=metrics)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}

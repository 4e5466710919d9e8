"""The agent's tools: read-only lookups over the telemetry store and one way to act.

Every tool returns a ``ToolResult`` (status, params, data, error), so a caller (the
deterministic plan, or an LLM in a function-calling loop) can see what failed and why instead
of an exception. Telemetry text (log bodies, span attributes, recorded prompts) comes back
under ``telemetry_text`` keys: it is data about the system, never instructions to follow.
Acting goes through ``propose_action`` only, which hands the action to the remediation
policy: the agent cannot execute anything the policy does not allow.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from aiops import semconv
from aiops.analytics.findings import NOT_WARMUP, Finding
from aiops.analytics.incidents import IncidentEvidence, rank_causes, symptom_of
from aiops.analytics.slo import SLO_BURN, Objective
from aiops.capacity import Capacity
from aiops.errors import AIOpsError
from aiops.identity import INGRESS_SERVICE
from aiops.remediation.actions import Action, ActionKind, new_action
from aiops.store import QueryResult, Store

if TYPE_CHECKING:
    from agents.memory import LazyMemory

__all__ = ["PROPOSABLE", "Proposer", "ToolResult", "ToolStatus", "Toolbox"]

NS = 1_000_000_000
RECENT_TRACE_S = 3600  # trace_lookup searches this far back first
PROPOSABLE = (ActionKind.ROLLBACK, ActionKind.SCALE, ActionKind.PROMOTE, ActionKind.SHED_LOAD)
_TEXT_LIMIT = 300  # characters of any one telemetry text handed to a model
_ID = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")


class ToolStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    APPROVAL_REQUIRED = "approval_required"  # the policy wants a human to approve it
    DENIED = "denied"  # the policy refused it


class ToolResult(BaseModel):
    tool: str
    status: ToolStatus
    params: dict[str, Any] = Field(default_factory=dict)
    data: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is ToolStatus.OK


class Proposer(Protocol):
    """What ``propose_action`` needs: the remediator's ``propose``."""

    def propose(self, action: Action, actor: str, now_ns: int) -> dict[str, Any]: ...
    def decide(self, action_id: str, approve: bool, actor: str, now_ns: int
               ) -> dict[str, Any]: ...


@dataclass
class Limits:
    sql_rows: int = 200
    sql_timeout_s: float = 5.0
    lookup_rows: int = 20


def _text(value: Any) -> dict[str, str] | None:
    """Telemetry text, truncated and labelled as data."""
    if value is None:
        return None
    s = value if isinstance(value, str) else json.dumps(value, default=str)
    return {"telemetry_text": s[:_TEXT_LIMIT] + ("..." if len(s) > _TEXT_LIMIT else "")}


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / NS))


class Toolbox:
    """The tools over one store. ``now`` is injectable so evaluations replay a fixed moment."""

    def __init__(self, store: Store, proposer: Proposer | None = None,
                 limits: Limits | None = None, now: Callable[[], int] = time.time_ns,
                 actor: str = "agent", objectives: Sequence[Objective] = (),
                 models: Sequence[str] = (), memory: LazyMemory | None = None,
                 capacities: Sequence[Capacity] = (),
                 findings: Callable[[], Sequence[Finding]] | None = None,
                 own_models: Sequence[str] = ()) -> None:
        self.store = store
        # Models aiops serves for itself (the agent's LLM): their traffic is the agent's own
        # questions, never a change or a load of the team's.
        self.own_models = tuple(own_models)
        # What the analyzer finds that is not a page (IncidentTracker.held): answers use it.
        self.findings = findings
        # What each model is given (its specs' memory reservation, queue bound): answers
        # about use say it against these.
        self.capacities = {c.model: c for c in capacities}
        self.memory = memory  # past incidents by similarity (agents.memory)
        self.objectives = tuple(objectives)  # the models' SLOs, for questions about them
        self.models = tuple(models)  # models declared (specs) beside those the store has seen
        self.actor = actor  # who the ledger names for proposals: "agent:<user>"
        self.proposer = proposer
        self.limits = limits or Limits()
        self.now = now
        self._tools: dict[str, Callable[..., Any]] = {
            "list_incidents": self.list_incidents,
            "list_findings": self.list_findings,
            "describe_incident": self.describe_incident,
            "rca_evidence": self.rca_evidence,
            "run_sql": self.run_sql,
            "metric_lookup": self.metric_lookup,
            "log_lookup": self.log_lookup,
            "trace_lookup": self.trace_lookup,
            "serving": self.serving,
            "similar_incidents": self.similar_incidents,
            "serving_load": self.serving_load,
            "propose_action": self.propose_action,
            "decide_action": self.decide_action,
        }

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def function(self, name: str) -> Callable[..., Any]:
        return self._tools[name]

    def call(self, name: str, **params: Any) -> ToolResult:
        """Run a tool by name; any failure is a result with status ``error``."""
        fn = self._tools.get(name)
        if fn is None:
            return ToolResult(tool=name, status=ToolStatus.ERROR, params=params,
                              error=f"no tool {name!r}; tools: {', '.join(self._tools)}")
        try:
            out = fn(**params)
        except TypeError as exc:
            return ToolResult(tool=name, status=ToolStatus.ERROR, params=params,
                              error=f"bad parameters: {exc}")
        if isinstance(out, ToolResult):
            return out
        return ToolResult(tool=name, status=ToolStatus.OK, params=params, data=out)

    # -- the tools ----------------------------------------------------------------------------

    def query(self, sql: str, params: list[Any], limit: int | None = None) -> QueryResult:
        """One read of the tools: with a lake, the telemetry tables hold every server's rows
        (a question about a model served by another server's cluster is answered too)."""
        return self.store.query(sql, params, limit or self.limits.lookup_rows,
                                timeout_s=self.limits.sql_timeout_s, every_server=True)

    def _rows(self, sql: str, params: list[Any], limit: int | None = None
              ) -> list[dict[str, Any]]:
        result = self.query(sql, params, limit)
        return [dict(zip(result.columns, r, strict=True)) for r in result.rows]

    def _fail(self, tool: str, params: dict[str, Any], error: str) -> ToolResult:
        return ToolResult(tool=tool, status=ToolStatus.ERROR, params=params, error=error)

    def list_incidents(self, minutes: float = 60, model: str | None = None,
                       status: str | None = None) -> Any:
        """Incidents active at any time in the last ``minutes`` (newest first): id, status,
        severity, service (model), version, fault class, opened/closed, summary. ``model``
        may name a Serve application: its deployments' incidents are its own (``shop``
        covers ``shop.Scorer``)."""
        params = {"minutes": minutes, "model": model, "status": status}
        if not 0 < minutes <= 7 * 24 * 60:
            return self._fail("list_incidents", params, "minutes must be in (0, 10080]")
        now = self.now()
        start = now - int(minutes * 60 * NS)
        sql = """
            SELECT incident_id, status, severity, service, model_version, replica,
                   fault_class, epoch_ns(opened_at) AS opened_ns,
                   epoch_ns(closed_at) AS closed_ns, summary,
                   CAST(json_extract(evidence, '$.onset_ns') AS BIGINT) AS onset_ns
            FROM incidents_current
            WHERE epoch_ns(opened_at) <= ? AND (closed_at IS NULL OR epoch_ns(closed_at) >= ?)
              AND (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], service))
              AND (? IS NULL OR status = ?)
            ORDER BY (severity = 'page') DESC, opened_at DESC"""
        try:
            services = None if model is None else self._app_services(model, start)
            rows = self._rows(sql, [now, start, services, services, status, status])
        except AIOpsError as exc:
            return self._fail("list_incidents", params, str(exc))
        for r in rows:
            r["opened"], r["closed"] = _iso(r.pop("opened_ns")), _iso(r.pop("closed_ns"))
            r["onset"] = _iso(r.pop("onset_ns"))
        return rows

    def list_findings(self, minutes: float = 60, model: str | None = None) -> Any:
        """What the analyzer found lately that is not a page (CPU contention inside the SLO,
        retransmits, a tail on a healthy release): the causes ranked as an incident's would be
        (best first) and each finding. ``model`` may name a Serve application."""
        params = {"minutes": minutes, "model": model}
        if not 0 < minutes <= 7 * 24 * 60:
            return self._fail("list_findings", params, "minutes must be in (0, 10080]")
        since = self.now() - int(minutes * 60 * NS)
        try:
            services = None if model is None else set(self._app_services(model, since))
        except AIOpsError as exc:
            return self._fail("list_findings", params, str(exc))
        found = [f for f in (self.findings() if self.findings else [])
                 if f.end_ns >= since and (services is None or f.subject in services
                                           or f.entity.service in services)]
        if not found:
            return {"causes": [], "findings": [], "onset": None}
        causes = rank_causes(found, None, symptom_of(found))
        onset = min((f.start_ns for f in found if f.detector != SLO_BURN),
                    default=min(f.start_ns for f in found))
        return {"causes": [c.to_json() for c in causes[:3]],
                "findings": [{"detector": f.detector, "entity": str(f.entity),
                              "fault_class": str(f.fault_class), "score": round(f.score, 3),
                              "start": _iso(f.start_ns), "summary": f.summary,
                              "change": f.change} for f in sorted(found, key=lambda f: -f.score)],
                "onset": _iso(onset)}

    def _app_services(self, name: str, since_ns: int) -> list[str]:
        """``name`` and, where it names a Serve application, its deployments' services: the
        services whose spans say they are that application's (``ray.serve.app``, however
        they are named), and those named ``<app>.<deployment>`` (aiops.identity's rule)."""
        rows = self._rows(
            f"""SELECT DISTINCT service_name FROM spans
                WHERE {semconv.APP} = ? AND end_time > make_timestamp_ns(?)
                UNION SELECT DISTINCT service FROM incidents_current
                WHERE starts_with(service, ? || '.')""", [name, since_ns, name], 200)
        return sorted({name, *(str(r["service_name"]) for r in rows if r["service_name"])})

    def describe_incident(self, incident_id: str) -> Any:
        """One incident's state with its ranked root causes and context (no raw findings)."""
        params = {"incident_id": incident_id}
        if not _ID.match(incident_id):
            return self._fail("describe_incident", params, "not an incident id")
        try:
            rows = self._rows("SELECT *, epoch_ns(opened_at) AS opened_ns FROM "
                              "incidents_current WHERE incident_id = ?", [incident_id], 1)
        except AIOpsError as exc:
            return self._fail("describe_incident", params, str(exc))
        if not rows:
            return self._fail("describe_incident", params, f"no incident {incident_id!r}")
        row = rows[0]
        try:  # the column's typed contract (aiops.analytics.incidents)
            evidence = IncidentEvidence.parse(row.pop("evidence")).to_dict()
        except ValueError as exc:
            return self._fail("describe_incident", params, f"unreadable evidence: {exc}")
        out = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        out["onset"] = _iso(evidence.get("onset_ns"))
        out["root_causes"] = evidence.get("root_causes", [])
        out["context"] = evidence.get("context", [])
        out["actions"] = self._actions(incident_id)
        return out

    def _actions(self, incident_id: str) -> list[dict[str, Any]]:
        rows = self._rows("SELECT action_id, kind, target, mode, status, outcome "
                          "FROM actions_current WHERE incident_id = ? ORDER BY created_at",
                          [incident_id])
        for r in rows:
            r["outcome"] = json.loads(r["outcome"] or "{}")
        return rows

    def rca_evidence(self, incident_id: str) -> Any:
        """The evidence behind an incident's top root cause: trace ids, log templates and
        metric series, each with observed vs baseline."""
        described = self.describe_incident(incident_id)
        if isinstance(described, ToolResult):
            return described.model_copy(update={"tool": "rca_evidence"})
        causes = described["root_causes"]
        if not causes:
            return {"incident_id": incident_id, "cause": None, "evidence": []}
        top = causes[0]
        return {"incident_id": incident_id, "cause": {k: top[k] for k in (
            "entity", "service", "version", "replica", "fault_class", "confidence",
            "detectors")}, "evidence": top["evidence"][:12],
            "context": described["context"][:6]}

    def run_sql(self, sql: str) -> Any:
        """One read-only SELECT over the telemetry tables (spans, logs, metric_points,
        incidents_current, actions_current); rows and time are limited."""
        params = {"sql": sql}
        if len(sql) > 10_000:
            return self._fail("run_sql", params, "query over 10,000 characters")
        try:
            # Text an LLM wrote is untrusted (prompt injection): the guarded read path.
            result = self.store.query_untrusted(sql, [], self.limits.sql_rows,
                                                self.limits.sql_timeout_s, 4 * 2**20,
                                                every_server=True)
        except AIOpsError as exc:
            return self._fail("run_sql", params, str(exc))
        return {"columns": result.columns,
                "rows": [[_cell(v) for v in r] for r in result.rows],
                "truncated": result.truncated}

    def metric_lookup(self, model: str, minutes: float = 15, version: str | None = None,
                      bucket_s: int = 60) -> Any:
        """The model's SLIs per version and time bucket from its spans: requests, failed
        share, median and p95 latency (ms)."""
        params = {"model": model, "minutes": minutes, "version": version,
                  "bucket_s": bucket_s}
        if not 0 < minutes <= 24 * 60 or not 1 <= bucket_s <= 3600:
            return self._fail("metric_lookup", params,
                              "minutes in (0, 1440] and bucket_s in [1, 3600]")
        now = self.now()
        sql = f"""
            SELECT {semconv.VERSION} AS version,
                   (epoch_ns(start_time) // ?) * ? AS bucket_ns, count(*) AS requests,
                   round(avg({semconv.FAILED}::INTEGER), 4) AS failed,
                   round(median(duration_ns) / 1e6, 1) AS p50_ms,
                   round(quantile_cont(duration_ns, 0.95) / 1e6, 1) AS p95_ms
            FROM spans
            WHERE service_name = ?
              AND start_time > make_timestamp_ns(?) AND start_time <= make_timestamp_ns(?)
              AND (? IS NULL OR {semconv.VERSION} = ?) AND {NOT_WARMUP}
            GROUP BY ALL ORDER BY bucket_ns, version"""
        step = bucket_s * NS
        try:
            rows = self._rows(sql, [step, step, model, now - int(minutes * 60 * NS), now,
                                    version, version], 2000)
        except AIOpsError as exc:
            return self._fail("metric_lookup", params, str(exc))
        for r in rows:
            r["time"] = _iso(r.pop("bucket_ns"))
        return rows

    def log_lookup(self, model: str, minutes: float = 15, min_severity: int = 13) -> Any:
        """The most frequent log messages of a service at or above a severity (13 = WARN),
        with a count, first/last time and one trace id each."""
        params = {"model": model, "minutes": minutes, "min_severity": min_severity}
        if not 0 < minutes <= 24 * 60:
            return self._fail("log_lookup", params, "minutes must be in (0, 1440]")
        now = self.now()
        sql = f"""
            SELECT body, max(severity_number) AS severity, count(*) AS n,
                   epoch_ns(min(time)) AS first_ns, epoch_ns(max(time)) AS last_ns,
                   any_value(trace_id) AS trace_id,
                   any_value({semconv.VERSION}) AS version
            FROM logs
            WHERE service_name = ? AND coalesce(severity_number, 0) >= ?
              AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
            GROUP BY body ORDER BY n DESC"""
        try:
            rows = self._rows(sql, [model, min_severity, now - int(minutes * 60 * NS), now])
        except AIOpsError as exc:
            return self._fail("log_lookup", params, str(exc))
        return [{"message": _text(r["body"]), "severity": r["severity"], "count": r["n"],
                 "first": _iso(r["first_ns"]), "last": _iso(r["last_ns"]),
                 "trace_id": r["trace_id"], "version": r["version"]} for r in rows]

    def trace_lookup(self, trace_id: str) -> Any:
        """The spans of one trace: service, name, duration, status, model and version."""
        params = {"trace_id": trace_id}
        if not re.fullmatch(r"[0-9a-f]{32}", trace_id):
            return self._fail("trace_lookup", params, "a trace id is 32 hex digits")
        sql = """
            SELECT service_name, name, span_id, parent_span_id,
                   round(duration_ns / 1e6, 1) AS duration_ms, status_code,
                   model_version AS version, http_status,
                   epoch_ns(start_time) AS start_ns, attributes
            FROM spans WHERE trace_id = ? {} ORDER BY start_time"""
        # The last hour first (where an incident's evidence points): the time column's zone
        # maps skip the rest, where a random trace id skips nothing. That answer is the whole
        # trace when its root span started within the hour (its spans start after it, so
        # end within the hour too); else the whole store is searched.
        recent = self.now() - RECENT_TRACE_S * NS
        try:
            rows = self._rows(sql.format("AND end_time > make_timestamp_ns(?)"),
                              [trace_id, recent], 100)
            if not any(r["parent_span_id"] is None and r["start_ns"] > recent for r in rows):
                rows = self._rows(sql.format(""), [trace_id], 100)
        except AIOpsError as exc:
            return self._fail("trace_lookup", params, str(exc))
        if not rows:
            return self._fail("trace_lookup", params, f"no spans for trace {trace_id}")
        for r in rows:
            r["start"] = _iso(r.pop("start_ns"))
            r["attributes"] = _text(r["attributes"])
        return rows

    def serving(self, model: str, minutes: float = 15) -> Any:
        """The versions and replicas of a model that answered requests in the last
        ``minutes``: per version its requests, replicas, first and last request (oldest
        first)."""
        params = {"model": model, "minutes": minutes}
        if not 0 < minutes <= 7 * 24 * 60:
            return self._fail("serving", params, "minutes must be in (0, 10080]")
        now = self.now()
        sql = f"""
            SELECT {semconv.VERSION} AS version,
                   count(*) AS requests,
                   count(DISTINCT {semconv.REPLICA}) AS replicas,
                   epoch_ns(min(start_time)) AS first_ns, epoch_ns(max(start_time)) AS last_ns
            FROM spans
            WHERE service_name = ?
              AND start_time > make_timestamp_ns(?) AND start_time <= make_timestamp_ns(?)
              AND {NOT_WARMUP}
            GROUP BY ALL HAVING version IS NOT NULL ORDER BY first_ns"""
        try:
            rows = self._rows(sql, [model, now - int(minutes * 60 * NS), now])
        except AIOpsError as exc:
            return self._fail("serving", params, str(exc))
        for r in rows:
            r["first"], r["last"] = _iso(r.pop("first_ns")), _iso(r.pop("last_ns"))
        return rows

    def serving_load(self, seconds: float = 10, exclude: str | None = None) -> Any:
        """How many requests to the models (their root spans) began in the last ``seconds``,
        not counting model ``exclude`` (the agent's own)."""
        params = {"seconds": seconds, "exclude": exclude}
        if not 0 < seconds <= 3600:
            return self._fail("serving_load", params, "seconds must be in (0, 3600]")
        now = self.now()
        sql = f"""
            SELECT count(*) FROM spans
            WHERE parent_span_id IS NULL AND start_time > make_timestamp_ns(?)
              AND start_time <= make_timestamp_ns(?)
              AND coalesce({semconv.MODEL},
                           CASE WHEN {semconv.NOT_INGRESS_SQL} THEN service_name END)
                  IS DISTINCT FROM ?
              AND coalesce({semconv.MODEL}, service_name)
                  <> '{INGRESS_SERVICE}'"""
        try:
            rows = self._rows(sql, [now - int(seconds * NS), now, exclude], 1)
        except AIOpsError as exc:
            return self._fail("serving_load", params, str(exc))
        return int(next(iter(rows[0].values()))) if rows else 0

    def similar_incidents(self, incident_id: str) -> Any:
        """Resolved incidents like this one (same fault class, most similar first), each with
        what fixed it and whether the fix was verified."""
        params = {"incident_id": incident_id}
        if not _ID.match(incident_id):
            return self._fail("similar_incidents", params, "not an incident id")
        memory = self.memory.get() if self.memory is not None else None
        if memory is None:
            return self._fail("similar_incidents", params, "no incident memory here")
        try:
            found = memory.similar(self.store, incident_id)
        except AIOpsError as exc:
            return self._fail("similar_incidents", params, str(exc))
        return [{**asdict(r), "seen_before": r.line()} for r in found]

    def decide_action(self, action_id: str, approve: bool) -> ToolResult:
        """Approve or deny a pending action (one the policy left for a person)."""
        params = {"action_id": action_id, "approve": approve}
        if self.proposer is None:
            return self._fail("decide_action", params,
                              "approving is not available here (no remediation policy)")
        if not re.fullmatch(r"act-[0-9a-f]{6,32}", action_id):
            return self._fail("decide_action", params, "not an action id (act-...)")
        try:
            decided = self.proposer.decide(action_id, approve, self.actor, self.now())
        except (KeyError, ValueError, AIOpsError) as exc:
            return self._fail("decide_action", params, _decide_error(exc))
        return ToolResult(tool="decide_action", status=ToolStatus.OK, params=params,
                          data=decided)

    def propose_action(self, kind: str, model: str, version: str | None = None,
                       reason: str = "", incident_id: str | None = None,
                       min_replicas: int | None = None, max_replicas: int | None = None
                       ) -> ToolResult:
        """Propose rollback, scale, promote or shed_load (refuse batch-class requests) of a
        model (version). The remediation policy
        decides: executed, waiting for approval, recorded as a dry run, or refused."""
        params = {"kind": kind, "model": model, "version": version, "reason": reason,
                  "incident_id": incident_id}
        if self.proposer is None:
            return self._fail("propose_action", params,
                              "acting is not available here (no remediation policy)")
        try:
            action_kind = ActionKind(kind)
        except ValueError:
            action_kind = None
        if action_kind not in PROPOSABLE:
            return self._fail("propose_action", params, f"kind must be one of "
                              f"{', '.join(str(k) for k in PROPOSABLE)}, not {kind!r}")
        assert action_kind is not None
        if not _ID.match(model) or (version is not None and not _ID.match(version)):
            return self._fail("propose_action", params, "bad model or version name")
        extra: dict[str, Any] = {}
        if action_kind is ActionKind.SHED_LOAD:
            extra = {"classes": ["batch"]}
        if action_kind is ActionKind.SCALE:
            if min_replicas is None or max_replicas is None \
                    or not 1 <= min_replicas <= max_replicas:
                return self._fail("propose_action", params,
                                  "scale needs 1 <= min_replicas <= max_replicas")
            extra = {"min_replicas": min_replicas, "max_replicas": max_replicas}
        action = new_action(incident_id, action_kind, model, version, self.now(), **extra)
        action.reason = reason[:500]
        try:
            decided = self.proposer.propose(action, self.actor, self.now())
        except AIOpsError as exc:
            return self._fail("propose_action", params, str(exc))
        status = {"pending": ToolStatus.APPROVAL_REQUIRED, "denied": ToolStatus.DENIED,
                  "failed": ToolStatus.ERROR}.get(decided["status"], ToolStatus.OK)
        error = {ToolStatus.DENIED: decided.get("decision"),
                 ToolStatus.ERROR: "the action failed (see the actions list)"}.get(status)
        return ToolResult(tool="propose_action", status=status, params=params, data=decided,
                          error=error)


def _decide_error(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no action {exc.args[0]!r}"
    return str(exc)


def _cell(v: Any) -> Any:
    if isinstance(v, (int, float, bool)) or v is None:
        return v
    return str(v)[:_TEXT_LIMIT]

"""The deterministic investigation plan: which tools to call for an intent, and the facts
and evidence they establish.

The plan does not depend on any model: incident -> its top root cause -> the evidence behind
it (traces, log templates, metric series) -> the SLIs and warning logs of the component ->
the actions taken. Every claim in the answer is one of these results, tagged (E1, E2, ...)
with the id a reader can look up.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import BaseModel, Field

from agents.intent import Intent, IntentKind
from agents.questions.model import Report
from agents.tools import Toolbox, ToolResult, ToolStatus
from aiops.identity import INGRESS_SERVICE

__all__ = ["EvidenceItem", "Facts", "Findings", "Investigation", "investigate"]

INGRESS = INGRESS_SERVICE
ALSO_MAX = 8  # other incidents an investigation of a model or an app lists
FINDING = "finding"  # Facts of findings that are not a page (no incident id)


class EvidenceItem(BaseModel):
    tag: str  # E1, E2, ...: what a narrative cites
    kind: str  # incident, trace, log_template, metric, action
    id: str  # what to look up: incident id, trace id, template text, metric name, action id
    text: str  # one line a person reads


class Facts(BaseModel):
    incident_id: str
    status: str
    severity: str
    component: str
    version: str | None = None
    replica: str | None = None
    fault_class: str | None = None
    onset: str | None = None
    confidence: float | None = None
    summary: str = ""
    recurrences: int = 1  # incidents of the same fault on it in the window


class Findings(BaseModel):
    """What an investigation established; the answer carries the same."""

    intent: Intent
    facts: Facts | None = None
    incidents: list[dict[str, Any]] = Field(default_factory=list)
    evidence: list[EvidenceItem] = Field(default_factory=list)
    slis: list[dict[str, Any]] = Field(default_factory=list)
    logs: list[dict[str, Any]] = Field(default_factory=list)
    actions: list[dict[str, Any]] = Field(default_factory=list)
    proposal: ToolResult | None = None
    report: Report | None = None  # a question about the telemetry: its figures and SQL


class Investigation(Findings):
    steps: list[ToolResult] = Field(default_factory=list)

    def add(self, kind: str, id: str, text: str) -> EvidenceItem:
        for e in self.evidence:
            if e.kind == kind and e.id == id:
                return e
        item = EvidenceItem(tag=f"E{len(self.evidence) + 1}", kind=kind, id=id, text=text)
        self.evidence.append(item)
        return item

    def cites(self, kind: str) -> list[str]:
        return [e.id for e in self.evidence if e.kind == kind]


def _call(inv: Investigation, box: Toolbox, tool: str, **params: Any) -> ToolResult:
    result = box.call(tool, **params)
    inv.steps.append(result)
    return result


def investigate(box: Toolbox, intent: Intent) -> Investigation:
    inv = Investigation(intent=intent)
    if intent.kind is IntentKind.HELP:
        return inv
    if intent.kind is IntentKind.DECIDE_ACTION and intent.action_id:
        inv.proposal = _call(inv, box, "decide_action", action_id=intent.action_id,
                             approve=bool(intent.approve))
        return inv
    if intent.kind is IntentKind.DESCRIBE_INCIDENT and intent.incident_id:
        _incident(inv, box, intent.incident_id)
        return inv
    listed = _call(inv, box, "list_incidents", minutes=intent.minutes, model=intent.model)
    inv.incidents = listed.data if listed.ok else []
    if not inv.incidents and intent.model is not None:
        # Requests reach a model through the ingress: a fault there (a flood of invalid
        # requests, say) is the answer when the model itself had none.
        via = _call(inv, box, "list_incidents", minutes=intent.minutes, model=INGRESS)
        inv.incidents = via.data if via.ok else []
    if not inv.incidents and intent.kind in (IntentKind.INVESTIGATE,
                                             IntentKind.LIST_INCIDENTS):
        # Nothing paged: what the analyzer found that is not a page is the answer.
        _findings(inv, box)
    if intent.kind is IntentKind.LIST_INCIDENTS:
        for i in inv.incidents:
            inv.add("incident", i["incident_id"], f"{i['status']} {i['severity']}: {i['summary']}")
    episode = _episode(inv.incidents)
    if episode:
        _incident(inv, box, episode[-1]["incident_id"])
        if inv.facts is not None and len(episode) > 1:
            # A recurring fault (a crash loop, a flapping canary) is one episode: it began
            # with the first of its incidents.
            inv.facts.onset = min(i["onset"] or i["opened"] for i in episode)
            inv.facts.recurrences = len(episode)
            for i in episode[:-1]:
                inv.add("incident", i["incident_id"], f"earlier, same fault: {i['summary']}")
        if intent.kind is IntentKind.INVESTIGATE and intent.model is not None:
            # "What happened to shop?": every incident of it (its deployments' too), not
            # only the episode the answer leads with, each with what was done about it.
            mine = {i["incident_id"] for i in episode}
            for i in [i for i in inv.incidents if i["incident_id"] not in mine][:ALSO_MAX]:
                _also(inv, box, i)
    if intent.model or inv.facts:
        _component(inv, box, inv.facts.component if inv.facts else str(intent.model))
    if intent.kind is IntentKind.PROPOSE_ACTION:
        _propose(inv, box)
    return inv


def _findings(inv: Investigation, box: Toolbox) -> None:
    found = _call(inv, box, "list_findings", minutes=inv.intent.minutes,
                  model=inv.intent.model)
    if found.ok and not found.data["causes"] and inv.intent.model is not None:
        # As for incidents: the ingress' trouble is the answer when the model had none.
        found = _call(inv, box, "list_findings", minutes=inv.intent.minutes, model=INGRESS)
    if not found.ok or not found.data["causes"]:
        return
    top = found.data["causes"][0]
    lead = found.data["findings"][0]
    inv.facts = Facts(
        incident_id=FINDING, status=FINDING, severity="none (not a page)",
        component=top["service"], version=top["version"], replica=top["replica"],
        fault_class=top["fault_class"],
        onset=found.data["onset"], confidence=top["confidence"], summary=lead["summary"])
    for f in found.data["findings"][:5]:
        inv.add(FINDING, f"{f['detector']}:{f['entity']}", f"{f['fault_class']} finding on "
                f"{f['entity']} since {f['start']}: {f['summary']}")


def _also(inv: Investigation, box: Toolbox, i: dict[str, Any]) -> None:
    version = f"@{i['model_version']}" if i["model_version"] else ""
    inv.add("incident", i["incident_id"], f"also {i['status']}, opened {i['opened']}: "
            f"{i['fault_class'] or 'anomalies'} on {i['service']}{version}: {i['summary']}")
    described = _call(inv, box, "describe_incident", incident_id=i["incident_id"])
    for a in described.data["actions"] if described.ok else []:
        inv.actions.append(a)
        inv.add("action", a["action_id"], f"{a['kind']} {a['target']}: {a['status']} "
                f"(policy mode {a['mode']}, for {i['incident_id']})")


def _episode(incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The incidents that matter most, oldest first: those of one component, version and
    fault class, preferring a model over the ingress (usually a symptom), a page over a
    ticket, an active episode over a resolved one, then the most recent."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for i in incidents:
        groups[(i["service"], str(i["model_version"]), str(i["fault_class"]))].append(i)
    if not groups:
        return []

    def rank(key: tuple[str, str, str]) -> tuple[bool, bool, bool, str]:
        items = groups[key]
        return (key[0] != INGRESS, any(i["severity"] == "page" for i in items),
                any(i["status"] != "resolved" for i in items), max(i["opened"] for i in items))

    return sorted(groups[max(groups, key=rank)], key=lambda i: i["opened"])


def _incident(inv: Investigation, box: Toolbox, incident_id: str) -> None:
    described = _call(inv, box, "describe_incident", incident_id=incident_id)
    if not described.ok:
        return
    d = described.data
    top = d["root_causes"][0] if d["root_causes"] else None
    inv.facts = Facts(
        incident_id=d["incident_id"], status=d["status"], severity=d["severity"],
        component=top["service"] if top else d["service"],
        version=top["version"] if top else d.get("model_version"),
        replica=top["replica"] if top else d.get("replica"),
        fault_class=top["fault_class"] if top else d.get("fault_class"),
        onset=d["onset"], confidence=top["confidence"] if top else None,
        summary=d["summary"] or "")
    f = inv.facts
    inv.add("incident", f.incident_id, f"{f.status} {f.severity} incident: {f.summary}")
    inv.actions = d["actions"]
    evidence = _call(inv, box, "rca_evidence", incident_id=incident_id)
    if evidence.ok:
        _cause_evidence(inv, box, evidence.data["evidence"])
    for a in inv.actions:
        inv.add("action", a["action_id"], f"{a['kind']} {a['target']}: {a['status']} "
                f"(policy mode {a['mode']})")
    if box.memory is not None:
        seen = _call(inv, box, "similar_incidents", incident_id=incident_id)
        for r in (seen.data if seen.ok else [])[:2]:
            inv.add("memory", r["incident_id"], r["seen_before"])


def _cause_evidence(inv: Investigation, box: Toolbox, evidence: list[dict[str, Any]]) -> None:
    traces = 0
    for e in evidence:
        if e["kind"] == "trace" and traces < 2:
            traces += 1
            label = "slowest request" if e["fault_class"] == "latency" else "a failed request"
            text = f"{label} of {e['entity']}"
            if e["observed"]:
                text += f": {e['observed']:g} (baseline {e['baseline']:g}, {e['signal']})"
            item = inv.add("trace", e["id"], text)
            if traces == 1:
                spans = _call(inv, box, "trace_lookup", trace_id=item.id)
                if spans.ok:
                    path = " -> ".join(f"{s['service_name']} {s['duration_ms']:g} ms"
                                       for s in spans.data[:4])
                    item.text += f"; spans: {path}"
        elif e["kind"] == "log_template":
            inv.add("log_template", e["id"], f"log template on {e['entity']}: "
                    f"{e['observed']:g} in the window (baseline {e['baseline']:g})")
        elif e["kind"] == "metric":
            inv.add("metric", f"{e['id']}{{{e['entity']}}}",
                    f"{e['signal']} of {e['entity']}: {e['observed']:g} "
                    f"(baseline {e['baseline']:g})")


def _component(inv: Investigation, box: Toolbox, model: str) -> None:
    slis = _call(inv, box, "metric_lookup", model=model, minutes=inv.intent.minutes)
    if slis.ok:
        inv.slis = slis.data
    logs = _call(inv, box, "log_lookup", model=model, minutes=inv.intent.minutes)
    if logs.ok:
        inv.logs = logs.data[:5]


def _propose(inv: Investigation, box: Toolbox) -> None:
    i = inv.intent
    model = i.model or (inv.facts.component if inv.facts else None)
    if model is None or i.action is None:
        return
    version = i.version or (inv.facts.version if inv.facts and inv.facts.component == model
                            else None)
    served = _call(inv, box, "serving", model=model, minutes=max(i.minutes, 60))
    versions = served.data if served.ok else []
    refusal = _impossible(i.action, model, version, versions)
    if refusal is not None:
        inv.proposal = ToolResult(tool="propose_action", status=ToolStatus.ERROR,
                                  params={"kind": i.action, "model": model,
                                          "version": version}, error=refusal)
        return
    if version is None and i.action in ("rollback", "promote") and versions:
        version = versions[-1]["version"]  # the newest: the canary or the latest rollout
    params: dict[str, Any] = {}
    if i.action == "scale":
        mine = [v for v in versions if version is None or v["version"] == version]
        # A version whose spans name no replica still runs one.
        current = max((v["replicas"] for v in mine), default=1) or 1
        # The count asked for is honoured, or refused with the reason; none asked: one more.
        wanted = i.replicas if i.replicas is not None else current + 1
        if wanted < 1:
            why = f"cannot scale {model} to {wanted} replicas: a serving model keeps at least 1"
        elif wanted == current:
            why = f"{model} already runs {current} replica{'s' if current != 1 else ''}"
        else:
            why = None
        if why is not None:
            inv.proposal = ToolResult(tool="propose_action", status=ToolStatus.ERROR,
                                      params={"kind": i.action, "model": model,
                                              "version": version, "replicas": wanted},
                                      error=why)
            return
        params = {"min_replicas": wanted, "max_replicas": wanted}
    inv.proposal = _call(inv, box, "propose_action", kind=i.action, model=model,
                         version=version, reason=f"chat-ops request: {i.action} {model}"
                         + (f" to {params['min_replicas']} replicas" if params else ""),
                         incident_id=inv.facts.incident_id if inv.facts else None, **params)


def _impossible(action: str, model: str, version: str | None,
                versions: list[dict[str, Any]]) -> str | None:
    """Why an action cannot do anything on what serves now (None when it can): a rollback
    or a promotion needs a second version; a version named must be serving."""
    names = [v["version"] for v in versions]
    if version is not None and names and version not in names:
        return (f"{model} {version} served no request in the last hour (serving: "
                f"{', '.join(names)})")
    if action in ("rollback", "promote") and len(names) < 2:
        only = f"only {names[0]} has" if names else "no version has"
        verb = "roll back" if action == "rollback" else "promote"
        return (f"cannot {verb} {model}: {only} served it in the last hour, so there is no "
                f"other version to {'return to' if action == 'rollback' else 'promote over'}")
    return None

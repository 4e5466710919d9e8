"""Incidents: findings deduplicated per service, ranked into root causes, with a lifecycle.

One incident is open per service (a model, or the ingress) at a time; every finding about that
service joins it. The incident is ``open`` while findings keep coming, ``mitigating`` once an
action was taken for it (remediation sets this), and ``resolved`` when no finding has fired
for ``resolve_after_s`` (the SLIs recovered). Each change is appended as a new row of the
``incidents`` table (``updated_at``), so its history stays; the latest row is its state.

Root causes: entities (model version, replica) ranked by their strongest finding. Kernel
findings (CPU contention, OOM, a crashed replica, retransmits) name the cause behind a
symptom (latency, errors) on the same model version; a caller (the ingress) is discounted
when one of the models it calls has findings of its own.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import pyarrow as pa

from aiops.analytics.findings import Entity, Evidence, FaultClass, Finding
from aiops.analytics.topology import ServiceMap
from aiops.schema import INCIDENTS

__all__ = ["Incident", "IncidentTracker", "RankedCause", "Status", "rank_causes", "to_table"]

CAUSE_CLASSES = (FaultClass.NODE, FaultClass.CRASH, FaultClass.MEMORY, FaultClass.CPU,
                 FaultClass.NETWORK)
# A lost node is the deepest: its replicas' exits (crashes) and failed requests follow from it.
CAUSE_DEPTH = {FaultClass.NODE: 5, FaultClass.MEMORY: 4, FaultClass.CRASH: 3,
               FaultClass.CPU: 2, FaultClass.NETWORK: 1}
CALLER_DISCOUNT = 0.5
INGRESS = "ingress"


class Status(StrEnum):
    OPEN = "open"
    MITIGATING = "mitigating"
    RESOLVED = "resolved"


@dataclass
class RankedCause:
    entity: Entity
    fault_class: FaultClass
    score: float
    confidence: float
    detectors: list[str]
    evidence: list[Evidence]
    node: str | None = None  # the Ray node at fault (fault class node)

    def to_json(self) -> dict[str, Any]:
        return {"entity": str(self.entity), "service": self.entity.service,
                "version": self.entity.version, "replica": self.entity.replica,
                "node": self.node,
                "fault_class": str(self.fault_class), "score": round(self.score, 3),
                "confidence": round(self.confidence, 3), "detectors": self.detectors,
                "evidence": [_evidence_json(e) for e in self.evidence]}


def _evidence_json(e: Evidence) -> dict[str, Any]:
    return {"kind": str(e.kind), "id": e.id, "entity": e.entity,
            "fault_class": str(e.fault_class), "signal": e.signal,
            "observed": e.observed, "baseline": e.baseline, "score": e.score}


def rank_causes(findings: list[Finding], calls: ServiceMap | None = None
                ) -> list[RankedCause]:
    """Entities at model-version level (replica kept when one replica stands out). The
    ingress calls every model; ``calls`` (a declared service map) adds who calls whom
    elsewhere: a caller whose callee also fires ranks below it."""
    by_version: dict[Entity, list[Finding]] = defaultdict(list)
    for f in findings:
        by_version[Entity(f.entity.service, f.entity.version)].append(f)
    callees = any(e.service != INGRESS for e in by_version)
    firing = {e.service for e in by_version}
    # The best score of a callee with a kernel-level cause (a crash, an OOM kill, ...).
    explained = max((f.score for e, fs in by_version.items() if e.service != INGRESS
                     for f in fs if f.fault_class in CAUSE_CLASSES), default=0.0)
    best: dict[str, float] = defaultdict(float)  # each firing service's best score
    for entity, fs in by_version.items():
        best[entity.service] = max(best[entity.service], *(f.score for f in fs))
    causes = []
    for entity, fs in by_version.items():
        score = max(f.score for f in fs)
        if entity.service == INGRESS and callees:
            score *= CALLER_DISCOUNT
            if explained:
                # The caller's symptoms are explained by its callee's cause: it ranks below.
                score = min(score, 0.99 * explained)
        elif calls is not None and (reached := calls.callees(entity.service) & firing):
            # A caller whose callee fires suffers from it: it ranks below the deepest firing
            # services it reaches (the incident is theirs, see IncidentTracker._subject),
            # whatever its score; a chain's middle ranks below its end too.
            deepest = [s for s in reached if not calls.callees(s) & firing] or list(reached)
            score = min(score * CALLER_DISCOUNT, 0.99 * max(best[s] for s in deepest))
        kernel = [f for f in fs if f.fault_class in CAUSE_CLASSES]
        # Among kernel causes the deeper one leads, whatever the scores: an OOM kill also
        # shows as the process's exit, a crash loop as CPU spikes while it restarts, and a
        # CPU-starved process drops packets (retransmits).
        lead = max(kernel or fs, key=lambda f: (CAUSE_DEPTH.get(f.fault_class, 0), f.score))
        replicas = {f.entity.replica for f in kernel if f.entity.replica}
        named = Entity(entity.service, entity.version,
                       next(iter(replicas)) if len(replicas) == 1 else None)
        evidence = [e for f in sorted(fs, key=lambda f: -f.score) for e in f.evidence]
        causes.append(RankedCause(named, lead.fault_class, score, 0.0,
                                  sorted({f.detector for f in fs}), evidence, lead.node))
    total = sum(c.score for c in causes) or 1.0
    for c in causes:
        c.confidence = c.score / total
    return sorted(causes, key=lambda c: -c.score)


@dataclass
class Incident:
    incident_id: str
    service: str
    opened_ns: int
    updated_ns: int
    last_firing_ns: int
    status: Status = Status.OPEN
    closed_ns: int | None = None
    findings: dict[tuple[str, Entity, FaultClass], Finding] = field(default_factory=dict)
    causes: list[RankedCause] = field(default_factory=list)
    extra_evidence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def onset_ns(self) -> int:
        """When it started: the earliest finding's window. A burn-rate finding's start is
        its long window's (up to an hour back), a bound rather than an onset: used only when
        nothing else fired."""
        sharp = [f.start_ns for f in self.findings.values() if f.detector != "slo_burn"]
        return min(sharp or [f.start_ns for f in self.findings.values()],
                   default=self.opened_ns)

    @property
    def severity(self) -> str:
        return "page" if any(k[0] == "slo_burn" for k in self.findings) else "ticket"

    @property
    def summary(self) -> str:
        if not self.causes:
            return f"{self.service}: anomalies"
        top = self.causes[0]
        if top.node:
            lead = next(f for f in self.findings.values() if f.node == top.node)
            return f"{top.fault_class} {top.node} under {top.entity}: {lead.summary}"
        # The lead finding is the top cause's own: a caller's symptom scoring higher would
        # name another service than the verdict does.
        own = [f for f in self.findings.values()
               if (f.entity.service, f.entity.version) == (top.entity.service,
                                                          top.entity.version)]
        lead = max(own or list(self.findings.values()), key=lambda f: f.score)
        return f"{top.fault_class} on {top.entity}: {lead.summary}"

    def row(self) -> dict[str, Any]:
        top = self.causes[0] if self.causes else None
        evidence = {"root_causes": [c.to_json() for c in self.causes],
                    "findings": [f.to_json() for f in self.findings.values()],
                    "context": self.extra_evidence, "onset_ns": self.onset_ns}
        return {
            "incident_id": self.incident_id, "opened_at": self.opened_ns,
            "closed_at": self.closed_ns, "status": str(self.status),
            "severity": self.severity, "service": self.service,
            "replica": top.entity.replica if top else None,
            "model_version": top.entity.version if top else None,
            "fault_class": str(top.fault_class) if top else None,
            "summary": self.summary, "evidence": json.dumps(evidence, default=str),
            "updated_at": self.updated_ns}


class IncidentTracker:
    def __init__(self, resolve_after_s: float = 30.0, refresh_s: float = 10.0,
                 calls: ServiceMap | None = None) -> None:
        self.resolve_after_ns = int(resolve_after_s * 1e9)
        self.refresh_ns = int(refresh_s * 1e9)
        self.calls = calls
        self.open: dict[str, Incident] = {}

    def _subject(self, f: Finding, firing: set[str]) -> str:
        """One incident per fault, not per symptom: with a service map, a caller's findings
        join the incident of a firing service it calls (the deepest, then by name)."""
        if self.calls is None:
            return f.subject
        reached = self.calls.callees(f.subject) & firing
        deepest = sorted(s for s in reached if not self.calls.callees(s) & firing)
        return deepest[0] if deepest else f.subject

    def update(self, findings: list[Finding], now_ns: int) -> list[Incident]:
        """Fold one round of findings in; return the incidents that changed."""
        changed: dict[str, Incident] = {}
        by_service: dict[str, list[Finding]] = defaultdict(list)
        firing = {f.subject for f in findings} | set(self.open)
        for f in findings:
            by_service[self._subject(f, firing)].append(f)
        for service, fs in by_service.items():
            inc = self.open.get(service)
            if inc is None:
                inc = Incident(f"inc-{uuid.uuid4().hex[:12]}", service, now_ns, now_ns, now_ns)
                self.open[service] = inc
            before = (inc.causes[0].entity, inc.causes[0].fault_class) if inc.causes else None
            for f in fs:
                key = (f.detector, f.entity, f.fault_class)
                seen = inc.findings.get(key)
                if seen is not None and seen.start_ns < f.start_ns:
                    # A finding refires every round with its window's start: keep when it
                    # first fired, or the incident's onset would creep forward.
                    f = replace(f, start_ns=seen.start_ns)
                inc.findings[key] = f
            inc.causes = rank_causes(list(inc.findings.values()), self.calls)
            inc.last_firing_ns = now_ns
            after = (inc.causes[0].entity, inc.causes[0].fault_class)
            # Persist when the verdict changes, and every refresh_s while the evidence grows.
            if before != after or inc.updated_ns == inc.opened_ns \
                    or now_ns - inc.updated_ns >= self.refresh_ns:
                inc.updated_ns = now_ns
                changed[inc.incident_id] = inc
        for service, inc in list(self.open.items()):
            if now_ns - inc.last_firing_ns >= self.resolve_after_ns:
                inc.status, inc.closed_ns, inc.updated_ns = Status.RESOLVED, now_ns, now_ns
                del self.open[service]
                changed[inc.incident_id] = inc
        return list(changed.values())

    def mark_mitigating(self, incident_id: str, now_ns: int) -> Incident | None:
        for inc in self.open.values():
            if inc.incident_id == incident_id and inc.status is Status.OPEN:
                inc.status, inc.updated_ns = Status.MITIGATING, max(now_ns, inc.updated_ns + 1)
                return inc
        return None


def to_table(incidents: list[Incident]) -> pa.Table:
    rows = [i.row() for i in incidents]
    schema = INCIDENTS.arrow_schema
    return pa.Table.from_pylist(rows, schema=schema)

"""Incidents: findings deduplicated per service, ranked into root causes, with a lifecycle.

An incident is a page: it opens only for what users feel (``pages``): an SLO burning, a
regression tied to a change (a version first served minutes ago, ``Finding.change``), or a
failure that kills what serves them (a crash, an OOM kill or a leak heading there, a lost
node). Every other finding (a tail on a healthy release, CPU contention, a log template's
rate) is held as a finding: it joins the incident of its service if one opens while it still
fires (its evidence, its onset), and is forgotten once it has not fired for
``resolve_after_s`` (``IncidentTracker.held`` lists those held now).

One incident is open per service (a model, or the ingress) at a time; every finding about that
service joins it. The fronts (the embedded ingress, Serve's HTTP proxies) call every service:
their findings join the incident of a firing service behind them, never one of their own
while one fires. The incident is ``open`` while findings keep coming, ``mitigating`` once an
action was taken for it (remediation sets this), and ``resolved`` when no finding has fired
for ``resolve_after_s``, or, once mitigating, when no bad observation of it has ended for
``recovered_after_s`` (the SLIs recovered). Each change is appended as a new row of the
``incidents`` table (``updated_at``), so its history stays; the latest row is its state.

The tracker owns the open incidents: one lock guards every change and read, readers get
snapshots (copies), never the live objects, and it is the one writer of ``incidents`` (the
analyzer's rounds and remediation's ``mark_mitigating`` both go through it). After each round
its listeners (remediation) hear what changed, outside the lock. A row's ``evidence`` column is
an ``IncidentEvidence`` as JSON: ``IncidentEvidence.parse`` reads it back.

Root causes: entities (model version, replica) ranked by their strongest finding. Kernel
findings (CPU contention, OOM, a crashed replica, retransmits) name the cause behind a
symptom (latency, errors) on the same model version; a caller (the ingress) is discounted
when one of the models it calls has findings of its own.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import TypeAdapter

from aiops.analytics.findings import Entity, Evidence, FaultClass, Finding
from aiops.analytics.rca.model import Symptom
from aiops.analytics.rca.symptom import SYMPTOM_CLASSES, leads, walk
from aiops.analytics.slo import SLO_BURN
from aiops.analytics.topology import ServiceMap
from aiops.identity import INGRESS_SERVICE, PROXY_SERVICE
from aiops.schema import INCIDENTS

if TYPE_CHECKING:
    from aiops.store import Store

__all__ = ["PAGE_CAUSES", "ContextSource", "EvidenceRecord", "Incident", "IncidentEvidence",
           "IncidentListener", "IncidentTracker", "RankedCause", "RankedCauseRecord", "Status",
           "pages", "rank_causes", "symptom_of", "to_table"]

log = logging.getLogger(__name__)

CAUSE_CLASSES = tuple(c for c in FaultClass if c not in SYMPTOM_CLASSES)
# A lost node is the deepest: its replicas' exits (crashes) and failed requests follow from it.
CAUSE_DEPTH = {FaultClass.NODE: 5, FaultClass.MEMORY: 4, FaultClass.CRASH: 3,
               FaultClass.CPU: 2, FaultClass.NETWORK: 1}
CALLER_DISCOUNT = 0.5
INGRESS = INGRESS_SERVICE
# Services that call every other one: the clients' view, a symptom while a service behind fires.
FRONTS = frozenset({INGRESS, PROXY_SERVICE})
# Failures users meet whatever an objective says: the process serving them killed (a crash,
# an OOM kill, a leak heading there) or its node lost.
PAGE_CAUSES = frozenset({FaultClass.CRASH, FaultClass.MEMORY, FaultClass.NODE})


def pages(f: Finding) -> bool:
    """Whether a finding is user impact (an incident opens for it): an SLO burning, a
    regression tied to a change, or a failure in ``PAGE_CAUSES``. A tail at 1.1x the median
    on a release that has served for an hour is not: it stays a finding."""
    return f.detector == SLO_BURN or f.change is not None or f.fault_class in PAGE_CAUSES


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

    def record(self) -> RankedCauseRecord:
        """As the ``evidence`` column states it."""
        e = self.entity
        return RankedCauseRecord(
            str(e), e.service, e.version, e.replica, self.node, str(self.fault_class),
            round(self.score, 3), round(self.confidence, 3), list(self.detectors),
            [EvidenceRecord(str(v.kind), v.id, v.entity, str(v.fault_class), v.signal,
                            v.observed, v.baseline, v.score) for v in self.evidence])

    def to_json(self) -> dict[str, Any]:
        return asdict(self.record())


# -- the evidence column: written here (Incident.row), read by the CLI, the agent, the demo ----


@dataclass(frozen=True)
class EvidenceRecord:
    """One observation behind a cause (an ``Evidence``), as written."""

    kind: str  # trace, log_template, metric, event
    id: str
    entity: str
    fault_class: str
    signal: str
    observed: float = 0.0
    baseline: float = 0.0
    score: float = 0.0


@dataclass(frozen=True)
class RankedCauseRecord:
    """One ranked root cause (a ``RankedCause``), as written: its entity both as text
    (``service@version/replica``) and by part."""

    entity: str
    service: str = ""
    version: str | None = None
    replica: str | None = None
    node: str | None = None  # the Ray node at fault (fault class node)
    fault_class: str = ""
    score: float = 0.0
    confidence: float = 0.0
    detectors: list[str] = field(default_factory=list)
    evidence: list[EvidenceRecord] = field(default_factory=list)


@dataclass(frozen=True)
class IncidentEvidence:
    """The ``evidence`` column of ``incidents``: the ranked root causes (best first), the
    findings behind them (``Finding.to_json``), the context gathered for the top cause
    (``aiops.analytics.correlate``: traces, log templates, metric deltas, changes) and the
    onset. ``to_json`` writes it; ``parse`` reads it back, from the text or its decoded dict."""

    root_causes: list[RankedCauseRecord] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)
    onset_ns: int | None = None

    @property
    def top(self) -> RankedCauseRecord | None:
        return self.root_causes[0] if self.root_causes else None

    def to_dict(self) -> dict[str, Any]:
        return {"root_causes": [asdict(c) for c in self.root_causes],
                "findings": self.findings, "context": self.context, "onset_ns": self.onset_ns}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def parse(cls, raw: str | bytes | Mapping[str, Any] | None) -> IncidentEvidence:
        """From the column's text (or its JSON decoded); parts missing are empty. Raises
        ``ValueError`` (pydantic's ``ValidationError`` is one) on what is not evidence."""
        if raw is None or raw in ("", b""):
            return cls()
        data = json.loads(raw) if isinstance(raw, str | bytes) else raw
        return _EVIDENCE.validate_python(data)


_EVIDENCE: TypeAdapter[IncidentEvidence] = TypeAdapter(IncidentEvidence)


def symptom_of(findings: list[Finding]) -> Symptom | None:
    """What the users saw: the service whose SLO burns hardest, and how (latency or errors);
    None when no SLO burns (the ranking is then the evidence's alone)."""
    burns = [f for f in findings if f.detector == SLO_BURN]
    if not burns:
        return None
    top = max(burns, key=lambda f: (f.score, f.entity.service))
    return Symptom(top.entity.service, top.fault_class)


def rank_causes(findings: list[Finding], calls: ServiceMap | None = None,
                symptom: Symptom | None = None) -> list[RankedCause]:
    """Entities at model-version level (replica kept when one replica stands out). The
    ingress calls every model; ``calls`` (a declared service map) adds who calls whom
    elsewhere: a caller whose callee also fires ranks below it. ``symptom`` (``symptom_of``)
    then orders them from the service whose users saw the fault (``rca.symptom``)."""
    by_version: dict[Entity, list[Finding]] = defaultdict(list)
    for f in findings:
        by_version[Entity(f.entity.service, f.entity.version)].append(f)
    callees = any(e.service not in FRONTS for e in by_version)
    firing = {e.service for e in by_version}
    # The best score of a callee with a kernel-level cause (a crash, an OOM kill, ...).
    explained = max((f.score for e, fs in by_version.items() if e.service not in FRONTS
                     for f in fs if f.fault_class in CAUSE_CLASSES), default=0.0)
    best: dict[str, float] = defaultdict(float)  # each firing service's best score
    for entity, fs in by_version.items():
        best[entity.service] = max(best[entity.service], *(f.score for f in fs))
    causes = []
    for entity, fs in by_version.items():
        score = max(f.score for f in fs)
        if entity.service in FRONTS and callees:
            # A front (the clients' view) is a symptom of whatever fires behind it: it ranks
            # below the strongest of them, however loud its own tail.
            score = min(score * CALLER_DISCOUNT, 0.99 * max(
                best[e.service] for e in by_version if e.service not in FRONTS))
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
    causes.sort(key=lambda c: -c.score)
    if symptom is not None:
        causes = _from_symptom(causes, findings, calls, symptom)
    total = sum(c.score for c in causes) or 1.0
    for c in causes:
        c.confidence = c.score / total
    return causes


def _from_symptom(causes: list[RankedCause], findings: list[Finding], calls: ServiceMap | None,
                  symptom: Symptom) -> list[RankedCause]:
    """``causes`` reordered along the walk from ``symptom`` through callees that fire with
    the symptom's kind or a cause (``symptom.leads``): where it ends first,
    the deeper first (then the one more firing callers converge on), then the callers it
    passed, then the rest. A cause moved down keeps
    a score just below the one above it, so score order stays the verdict's order."""
    services = {f.entity.service for f in findings}
    edges = set(calls.edges if calls is not None else ())
    edges |= {(front, s) for s in services if s not in FRONTS for front in FRONTS}
    path = walk(symptom.entity, edges, {f.entity.service for f in findings
                                         if leads(symptom.fault_class, f.fault_class)})
    if not path.ends:
        return causes
    order = {id(c): i for i, c in enumerate(causes)}
    ranked = sorted(causes, key=lambda c: (
        path.group(c.entity.service), -path.depth.get(c.entity.service, 0),
        -path.callers.get(c.entity.service, 0), order[id(c)]))
    for above, c in itertools.pairwise(ranked):
        c.score = min(c.score, 0.99 * above.score)
    return ranked


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
    # When its latest bad observation ended (Finding.last_ns; the round's time where a
    # finding has none): once an action was taken, recovery is judged from it.
    last_evidence_ns: int = 0

    @property
    def onset_ns(self) -> int:
        """When it started: the earliest finding's window. A burn-rate finding's start is
        its long window's (up to an hour back), a bound rather than an onset: used only when
        nothing else fired."""
        sharp = [f.start_ns for f in self.findings.values() if f.detector != SLO_BURN]
        return min(sharp or [f.start_ns for f in self.findings.values()],
                   default=self.opened_ns)

    @property
    def severity(self) -> str:
        return "page" if any(pages(f) for f in self.findings.values()) else "ticket"

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

    def evidence(self) -> IncidentEvidence:
        return IncidentEvidence([c.record() for c in self.causes],
                                [f.to_json() for f in self.findings.values()],
                                list(self.extra_evidence), self.onset_ns)

    def snapshot(self) -> Incident:
        """A copy, which later changes to this incident leave as it is."""
        return replace(self, findings=dict(self.findings), causes=list(self.causes),
                       extra_evidence=list(self.extra_evidence))

    def row(self) -> dict[str, Any]:
        top = self.causes[0] if self.causes else None
        return {
            "incident_id": self.incident_id, "opened_at": self.opened_ns,
            "closed_at": self.closed_ns, "status": str(self.status),
            "severity": self.severity, "service": self.service,
            "replica": top.entity.replica if top else None,
            "model_version": top.entity.version if top else None,
            "fault_class": str(top.fault_class) if top else None,
            "summary": self.summary, "evidence": self.evidence().to_json(),
            "updated_at": self.updated_ns}


# What a listener hears after each round: the incidents that changed (snapshots), and when.
IncidentListener = Callable[[list[Incident], int], None]
# The context gathered for an incident's top cause (traces, templates, metric deltas, ...).
ContextSource = Callable[[Incident], list[dict[str, Any]]]


class IncidentTracker:
    """The one owner of incidents. A lock guards every change and read: the analyzer's thread
    folds findings in (``update``), remediation marks incidents ``mitigating`` from the
    analyzer's or a request's thread, the server reads what is open. Readers get snapshots.
    Every change is written to ``store`` (``incidents``) here and nowhere else; without a
    store, incidents are only kept in memory. Listeners hear of each round after the lock is
    released, so that they may call back (``mark_mitigating``) from their own locks."""

    def __init__(self, resolve_after_s: float = 30.0, refresh_s: float = 10.0,
                 calls: ServiceMap | None = None, store: Store | None = None,
                 page: Callable[[Finding], bool] = pages,
                 recovered_after_s: float = 10.0, caller_grace_s: float = 5.0) -> None:
        self.resolve_after_ns = int(resolve_after_s * 1e9)
        # A service that calls others in the service map pages only once its paging findings
        # have been held this long: its callees' spans of the same failed requests come from
        # other processes' exporters (the OpenTelemetry SDK's batch delay is 5 s), and if a
        # callee fires meanwhile the incident is the callee's, named as what broke.
        self.caller_grace_ns = int(caller_grace_s * 1e9)
        self._paging_since: dict[str, int] = {}
        # A mitigating incident (an action was taken) resolves once no bad observation has
        # ended for this long: the spans of a rolled-back release still in the detectors'
        # window are about before the action, not news that it failed.
        self.recovered_after_ns = int(recovered_after_s * 1e9)
        self._page = page
        # Findings of services with no incident, none of them a page yet: (finding, when it
        # last fired) by service and key, until they stop firing for resolve_after_s.
        self._held: dict[str, dict[tuple[str, Entity, FaultClass], tuple[Finding, int]]] = {}
        # Per entity of a resolved incident, its latest bad observation: a finding that saw
        # nothing later (the window still holds the spans it resolved on) is not a new fault.
        self._past: dict[Entity, int] = {}
        self.refresh_ns = int(refresh_s * 1e9)
        self.store = store
        self._calls = calls
        self._open: dict[str, Incident] = {}
        self._listeners: list[IncidentListener] = []
        self._lock = threading.RLock()  # the state; no I/O is done under it
        self._write_lock = threading.Lock()  # the incidents table, one writer at a time

    @property
    def calls(self) -> ServiceMap | None:
        with self._lock:
            return self._calls

    @calls.setter
    def calls(self, calls: ServiceMap | None) -> None:
        with self._lock:
            self._calls = calls

    @property
    def open(self) -> dict[str, Incident]:
        """The open (or mitigating) incidents by service: snapshots, not the live ones."""
        with self._lock:
            return {service: inc.snapshot() for service, inc in self._open.items()}

    def open_ids(self) -> set[str]:
        with self._lock:
            return {inc.incident_id for inc in self._open.values()}

    def subscribe(self, listener: IncidentListener) -> None:
        """``listener(changed, now_ns)`` after every round, changed or not (outside the lock;
        what it raises, ``update`` raises)."""
        with self._lock:
            self._listeners.append(listener)

    def _subject(self, f: Finding, firing: set[str]) -> str:
        """One incident per fault, not per symptom: with a service map, a caller's findings
        join the incident of a firing service it calls (the deepest, then by name)."""
        return self._owner(f.subject, firing)

    def _owner(self, service: str, firing: set[str]) -> str:
        if service in FRONTS:
            behind = firing - FRONTS
            if behind:
                # A front calls everyone: the deepest service behind it that fires (by name
                # among equals; two apps failing at once behind one proxy is the limit).
                calls = self._calls
                deep = sorted(s for s in behind
                              if calls is None or not calls.callees(s) & behind)
                return deep[0] if deep else sorted(behind)[0]
            return service
        if self._calls is None:
            return service
        reached = self._calls.callees(service) & firing
        deepest = sorted(s for s in reached if not self._calls.callees(s) & firing)
        return deepest[0] if deepest else service

    def _join_callers(self, firing: set[str], now_ns: int, changed: dict[str, Incident]
                      ) -> None:
        """A caller's open incident (its users saw the fault first: a symptom) becomes the
        incident of the callee that now fires too, keeping its id (an action may name it);
        where the callee has one already, the older of the two takes the other's findings
        and the younger resolves."""
        for service in sorted(self._open):
            inc = self._open.get(service)
            owner = self._owner(service, firing)
            if inc is None or owner == service:
                continue
            del self._open[service]
            other = self._open.get(owner)
            keep, gone = (inc, other) if other is None or inc.opened_ns <= other.opened_ns \
                else (other, inc)
            if gone is not None:
                keep.findings.update({k: f for k, f in gone.findings.items()
                                      if k not in keep.findings})
                gone.updated_ns = self._stamp(gone, now_ns)
                gone.status, gone.closed_ns = Status.RESOLVED, now_ns
                changed[gone.incident_id] = gone
            keep.service = owner
            self._open[owner] = keep
            found = list(keep.findings.values())
            keep.causes = rank_causes(found, self._calls, symptom_of(found))
            keep.updated_ns = self._stamp(keep, now_ns)
            changed[keep.incident_id] = keep

    def update(self, findings: list[Finding], now_ns: int,
               context: ContextSource | None = None) -> list[Incident]:
        """Fold one round of findings in; ``context`` adds evidence to each changed incident
        that is not resolved; write the changes and tell the listeners. Returns the incidents
        that changed (snapshots)."""
        # The state changes under the lock; the I/O (context queries, the store write) runs
        # outside it, so readers (chat-ops, approvals, mark_mitigating) never wait on a query.
        with self._lock:
            changed = self._fold(findings, now_ns)
            out = [inc.snapshot() for inc in changed]
            listeners = list(self._listeners)
        if context is not None:
            extra = {inc.incident_id: context(inc) for inc in out
                     if inc.causes and inc.status is not Status.RESOLVED}
            if extra:
                with self._lock:
                    for inc in changed:
                        if inc.incident_id in extra:
                            inc.extra_evidence = extra[inc.incident_id]
                for inc in out:
                    if inc.incident_id in extra:
                        inc.extra_evidence = extra[inc.incident_id]
        with self._write_lock:  # one writer at a time: a round's rows, then the next's
            self._write(out)
        for inc in out:
            log.info("incident %s %s: %s", inc.incident_id, inc.status, inc.summary)
        for listener in listeners:
            listener(out, now_ns)
        return out

    @staticmethod
    def _stamp(inc: Incident, now_ns: int) -> int:
        # A mitigating row was written when the action ran, maybe after this round began: each
        # row of an incident is later than the one before, or the latest would not be its state.
        return max(now_ns, inc.updated_ns + 1) if inc.status is Status.MITIGATING else now_ns

    def _fold(self, findings: list[Finding], now_ns: int) -> list[Incident]:
        changed: dict[str, Incident] = {}
        findings = [f for f in findings
                    if f.last_ns is None or f.last_ns > self._past.get(f.entity, -1)]
        by_service: dict[str, list[Finding]] = defaultdict(list)
        firing = {f.subject for f in findings} | set(self._open)
        self._join_callers(firing, now_ns, changed)
        for f in findings:
            by_service[self._subject(f, firing)].append(f)
        self._forget_held(now_ns)
        for service, fs in by_service.items():
            inc = self._open.get(service)
            if inc is None:
                fs = self._hold(service, fs, firing, now_ns)
                if not fs:
                    continue  # findings, not a page: held until one pages or they stop
                inc = Incident(f"inc-{uuid.uuid4().hex[:12]}", service, now_ns, now_ns, now_ns)
                self._open[service] = inc
            before = (inc.causes[0].entity, inc.causes[0].fault_class) if inc.causes else None
            for f in fs:
                key = (f.detector, f.entity, f.fault_class)
                seen = inc.findings.get(key)
                if seen is not None and seen.start_ns < f.start_ns:
                    # A finding refires every round with its window's start: keep when it
                    # first fired, or the incident's onset would creep forward.
                    f = replace(f, start_ns=seen.start_ns)
                inc.findings[key] = f
            found = list(inc.findings.values())
            inc.causes = rank_causes(found, self._calls, symptom_of(found))
            inc.last_firing_ns = now_ns
            inc.last_evidence_ns = max(inc.last_evidence_ns, *(
                now_ns if f.last_ns is None else min(f.last_ns, now_ns) for f in fs))
            after = (inc.causes[0].entity, inc.causes[0].fault_class)
            # Persist when the verdict changes, and every refresh_s while the evidence grows.
            if before != after or inc.updated_ns == inc.opened_ns \
                    or now_ns - inc.updated_ns >= self.refresh_ns:
                inc.updated_ns = self._stamp(inc, now_ns)
                changed[inc.incident_id] = inc
        for service, inc in list(self._open.items()):
            recovered = inc.status is Status.MITIGATING and \
                now_ns - inc.last_evidence_ns >= self.recovered_after_ns
            if recovered or now_ns - inc.last_firing_ns >= self.resolve_after_ns:
                for f in inc.findings.values():
                    if f.last_ns is not None:
                        self._past[f.entity] = max(self._past.get(f.entity, 0), f.last_ns)
                inc.updated_ns = self._stamp(inc, now_ns)
                inc.status, inc.closed_ns = Status.RESOLVED, now_ns
                del self._open[service]
                changed[inc.incident_id] = inc
        return list(changed.values())

    def _hold(self, owner: str, fs: list[Finding], firing: set[str], now_ns: int
              ) -> list[Finding]:
        """Hold ``fs`` (the round's findings that ``owner`` would own) unless one pages; when
        one does, return them with every held finding ``owner`` now owns (the incident's
        earlier evidence and onset), else []."""
        held = self._held.setdefault(owner, {})
        for f in fs:
            key = (f.detector, f.entity, f.fault_class)
            seen = held.get(key)
            if seen is not None and seen[0].start_ns < f.start_ns:
                f = replace(f, start_ns=seen[0].start_ns)
            held[key] = (f, now_ns)
        if not any(self._page(f) for f in fs):
            return []
        since = self._paging_since.setdefault(owner, now_ns)
        calls = self._calls
        if owner not in FRONTS and calls is not None and calls.callees(owner) \
                and now_ns - since < self.caller_grace_ns:
            return []  # a caller: its callees' spans of the same requests may still come
        out: list[Finding] = []
        for service in sorted(self._held):
            if service == owner or self._owner(service, firing) == owner:
                out += [f for f, _ in self._held.pop(service).values()]
                self._paging_since.pop(service, None)
        return out

    def _forget_held(self, now_ns: int) -> None:
        # A window never reaches back an hour: older bounds filter nothing.
        self._past = {e: t for e, t in self._past.items() if now_ns - t < 3600 * 10**9}
        for service in list(self._held):
            kept = {k: v for k, v in self._held[service].items()
                    if now_ns - v[1] < self.resolve_after_ns}
            if kept:
                self._held[service] = kept
            else:
                del self._held[service]
                self._paging_since.pop(service, None)

    def held(self) -> list[Finding]:
        """The findings that fire or fired lately without an incident (none of them a page)."""
        with self._lock:
            return [f for fs in self._held.values() for f, _ in fs.values()]

    def mark_mitigating(self, incident_id: str, now_ns: int) -> Incident | None:
        """An action was taken for an open incident: it is ``mitigating``, and written so.
        None (nothing written) when it is not open: resolved, or already mitigating."""
        snap = None
        with self._lock:
            for inc in self._open.values():
                if inc.incident_id == incident_id and inc.status is Status.OPEN:
                    inc.status, inc.updated_ns = Status.MITIGATING, max(now_ns,
                                                                         inc.updated_ns + 1)
                    snap = inc.snapshot()
                    break
        if snap is not None:
            with self._write_lock:
                self._write([snap])
        return snap

    def _write(self, incidents: list[Incident]) -> None:
        if incidents and self.store is not None:
            self.store.append("incidents", to_table(incidents))


def to_table(incidents: list[Incident]) -> pa.Table:
    rows = [i.row() for i in incidents]
    schema = INCIDENTS.arrow_schema
    return pa.Table.from_pylist(rows, schema=schema)

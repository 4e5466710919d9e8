"""What the live detectors report: a finding about one serving entity, with its evidence.

An entity is a model version (``service`` = model name, ``version``), optionally narrowed to a
replica; evidence names rows that exist in the store (a trace id, a log template, a metric
series with its numbers), so every claim can be checked with one query.

Whose telemetry a row is (docs/attach.md has the whole mapping): ``service`` is the resource's
``service.name``; ``version`` the span's typed ``model_version`` column (``aiops.semconv``:
``aiops.model.version``, which aiops' own serving sets, also on the ingress, where it names the
version a request was routed to, else the resource's ``service.version``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from aiops.analytics.rca import Evidence, EvidenceKind, FaultClass

__all__ = ["NOT_WARMUP", "Entity", "Evidence", "EvidenceKind", "FaultClass",
           "Finding"]

# A new replica's warm-up inference (spec hooks.warmup) served no user: not a request.
NOT_WARMUP = "coalesce(attributes->>'aiops.warmup', '') <> 'true'"


@dataclass(frozen=True, order=True)
class Entity:
    service: str
    version: str | None = None
    replica: str | None = None

    def evidence(self, kind: EvidenceKind, id: str, fault: FaultClass, signal: str,
                 observed: float = 0.0, baseline: float = 0.0, score: float = 0.0
                 ) -> Evidence:
        return Evidence(kind, id, str(self), fault, signal, observed, baseline, score)

    def __str__(self) -> str:
        out = self.service + (f"@{self.version}" if self.version else "")
        return out + (f"/{self.replica}" if self.replica else "")


@dataclass
class Finding:
    detector: str  # slo_burn, trace_latency, trace_errors, ebpf_runq, log_template, ...
    entity: Entity
    fault_class: FaultClass
    score: float  # how far from normal; comparable within a detector (>= 1 means firing)
    start_ns: int
    end_ns: int
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    about: str | None = None  # the model served, when the entity is a caller (the ingress)
    node: str | None = None  # the Ray node at fault, for a node-level finding (a lost node)
    # The change this finding is tied to, when its entity changed recently (a version first
    # served inside the detector's lookback, after another version of the same service): a
    # regression tied to a change is a page even where no SLO is defined.
    change: str | None = None
    # When the latest bad observation behind it ended (a failed or slow span), where the
    # detector knows: a finding of spans from before an action is not news of after it.
    last_ns: int | None = None

    @property
    def subject(self) -> str:
        """What the incident is about: the model (for the ingress, the model it served)."""
        return self.about or self.entity.service

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["entity"] = str(self.entity)
        return out

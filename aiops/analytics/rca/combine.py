"""How an entity's evidence becomes one score and fault class, and callers are discounted
when a callee they call scored as high."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig, RootCause


def _source(e: Evidence) -> str:
    if e.fault_class is FaultClass.CRASH:
        return "crash"
    if e.kind is EvidenceKind.METRIC:
        return e.signal
    if e.kind is EvidenceKind.LOG_TEMPLATE:
        return "log"
    if e.signal.startswith("exclusive_ms"):
        return "trace:latency"
    if e.signal.startswith("network_ms"):
        return "trace:network"
    return "trace:structure"


def _strength(z: float, cfg: RankConfig, tie_break: bool = True) -> float:
    # Diminishing returns: a score 10x the threshold is not 10x the evidence, and past the
    # cap it only breaks ties.
    z = max(z, 0.0)
    capped = math.log1p(min(z, cfg.z_cap) / cfg.threshold)
    return capped + tie_break * 0.01 * math.log1p(max(z - cfg.z_cap, 0.0) / cfg.z_cap)


def combine_evidence(evidence: Iterable[Evidence], edges: set[tuple[str, str]],
             cfg: RankConfig) -> list[RootCause]:
    by_entity: dict[str, list[Evidence]] = defaultdict(list)
    for e in evidence:
        by_entity[e.entity].append(e)
    scores: dict[str, float] = {}
    saturated: dict[str, float] = {}  # the same without tie-breaks past the cap
    classes: dict[str, FaultClass] = {}
    for ent, items in by_entity.items():
        best: dict[str, Evidence] = {}
        for e in items:
            src = _source(e)
            if src not in best or e.score > best[src].score:
                best[src] = e
        weighted = {src: cfg.weights.get(src, 0.5) * _strength(e.score, cfg)
                    for src, e in best.items()}
        scores[ent] = _entity_score(weighted.values(), cfg)
        saturated[ent] = _entity_score(
            [cfg.weights.get(src, 0.5) * _strength(e.score, cfg, tie_break=False)
             for src, e in best.items()], cfg)
        classes[ent] = _class_of(best, weighted)
    final = dict(scores)
    for caller, callee in edges:
        # Evidence past the cap on both ends is a tie: the callee, deeper, is likelier.
        if (caller != callee and caller in scores and callee in scores
                and saturated[callee] >= cfg.callee_share * saturated[caller]):
            final[caller] = min(final[caller], scores[caller] * cfg.caller_discount)
    total = sum(final.values()) or 1.0
    ranked = sorted(final, key=lambda e: (-final[e], e))
    return [RootCause(ent, classes[ent], final[ent] / total, final[ent],
                      sorted(by_entity[ent], key=lambda e: -e.score)[: cfg.max_evidence])
            for ent in ranked]


def _entity_score(weighted: Iterable[float], cfg: RankConfig) -> float:
    ordered = sorted(weighted, reverse=True)
    return ordered[0] + cfg.corroboration * sum(ordered[1:]) if ordered else 0.0


def _class_of(best: Mapping[str, Evidence], weighted: Mapping[str, float]) -> FaultClass:
    top = max(weighted, key=lambda s: weighted[s])
    # A resource that moved names the class even when other evidence is stronger: a
    # CPU-starved service also slows down and changes its code path (timeouts).
    for source in ("crash", "metric:cpu", "metric:memory"):
        if source in best and weighted[source] >= 0.5 * weighted[top]:
            return best[source].fault_class
    return best[top].fault_class

"""How an entity's evidence becomes one score and fault class, and callers are discounted
when a callee they call scored as high."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from aiops.analytics.rca.graph import CallGraph
from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig, RootCause

_SYMPTOMS = frozenset({FaultClass.LATENCY, FaultClass.ERRORS})


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
                     cfg: RankConfig, roles: bool = False) -> list[RootCause]:
    """One score per entity, callers discounted. ``roles`` (a graph with no traced calls:
    the edges are declared, so a caller's evidence cannot be told from its callee's span by
    span): a pass-through node (one caller, one callee) ranks just below the callee it
    relays to, and among entities whose evidence is past the cap alike, the one more
    entities with evidence call (more of the anomaly converges on it) comes first."""
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
    final, level = dict(scores), dict(saturated)
    for caller, callee in edges:
        # Evidence past the cap on both ends is a tie: the callee, deeper, is likelier.
        if (caller != callee and caller in scores and callee in scores
                and saturated[callee] >= cfg.callee_share * saturated[caller]):
            final[caller] = min(final[caller], scores[caller] * cfg.caller_discount)
            level[caller] = min(level[caller], saturated[caller] * cfg.caller_discount)
    if roles:
        # What a relay can pass on: its users' symptom (latency, errors) only. A node whose
        # own resources moved (CPU, memory, network, a crash) is working, not relaying.
        relayed = {ent: {e.fault_class for e in items}
                   for ent, items in by_entity.items()
                   if all(e.fault_class in _SYMPTOMS for e in items)}
        graph = CallGraph.of(edges)
        _see_through_relays(final, level, graph, relayed, by_entity)

        def converging(e: str) -> int:  # callers with evidence of their own
            return sum(1 for c in graph.callers[e] if c in final)

        ranked = sorted(final, key=lambda e: (-round(level[e], 9), -converging(e),
                                              -final[e], e))
    else:
        ranked = sorted(final, key=lambda e: (-final[e], e))
    total = sum(final.values()) or 1.0
    return [RootCause(ent, classes[ent], final[ent] / total, final[ent],
                      sorted(by_entity[ent], key=lambda e: -e.score)[: cfg.max_evidence])
            for ent in ranked]


def _see_through_relays(final: dict[str, float], level: dict[str, float],
                        graph: CallGraph, relayed: Mapping[str, set[FaultClass]],
                        by_entity: Mapping[str, list[Evidence]]) -> None:
    """A node with one caller and one callee relays the call (a load balancer, a gateway, a
    function's trigger): when its own evidence is a symptom only (``relayed``) and the node
    it relays to (through further relays) shows the same kind, the relay ranks just below
    it, as a caller that only suffers."""

    def target(n: str) -> str | None:
        t, _ = graph.through(next(iter(graph.callees[n])), final.__contains__)
        return t if t in final else None

    # Deepest relays first, so a chain of them ends up in order below its target.
    for r in sorted((n for n in final if graph.relay(n)), key=graph.depth):
        t = target(r)
        if (t is not None and t != r and r in relayed
                and relayed[r] & {e.fault_class for e in by_entity[t]}):
            final[r] = min(final[r], 0.99 * final[t])
            level[r] = min(level[r], 0.99 * level[t])


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

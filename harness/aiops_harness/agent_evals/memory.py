"""Incident memory, leave one out over the incident fixtures: every fixture's incident (as the
live analyzer opens it on the fixture's telemetry) is remembered; each is then recalled with
itself left out, and its nearest past incident should share its fault class (and family).

Nothing is tuned on this: the text an incident is remembered by (``agents.memory.describe``)
and the similarity floor were fixed before the run. The figures say how often the nearest
neighbour is the same kind of failure, and how often the floor lets a wrong one through.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.memory import describe
from agents.memory_index import IncidentMemory
from aiops.store import Store
from aiops_harness.agent_evals.cases import Case, load_telemetry
from aiops_harness.agent_evals.replay import replay

__all__ = ["MemoryEval", "remembered_incident", "run_memory_eval"]

FAMILIES = ("canary", "errors", "crash", "cpu", "memory", "queue", "invalid-input",
            "slow-tokens", "config", "network")


@dataclass
class Remembered:
    case: str
    family: str
    incident_id: str
    fault_class: str | None
    text: str


@dataclass
class MemoryEval:
    items: list[Remembered] = field(default_factory=list)
    # per case: the nearest other incident (or None below the floor) and its score
    nearest: dict[str, tuple[Remembered | None, float]] = field(default_factory=dict)

    def rate(self, same: Callable[[Remembered, Remembered], bool]) -> float:
        hits = sum(1 for it in self.items
                   if (n := self.nearest[it.case][0]) is not None and same(it, n))
        return hits / max(len(self.items), 1)

    @property
    def recalled(self) -> float:
        return sum(self.nearest[it.case][0] is not None for it in self.items) / max(
            len(self.items), 1)


def _family(case: Case) -> str:
    return next((f for f in FAMILIES if f in case.tags), case.tags[0] if case.tags else "?")


def remembered_incident(case: Case) -> dict[str, Any] | None:
    """The case's incident on its expected component, as the analyzer left it."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "case.duckdb")
        try:
            load_telemetry(case, store)
            replay(case, store)
            rows = store.query(
                "SELECT incident_id, service, model_version, replica, fault_class, summary, "
                "evidence FROM incidents_current WHERE service = ? ORDER BY opened_at DESC",
                [case.expect.component], 1)
            return dict(zip(rows.columns, rows.rows[0], strict=True)) if rows.rows else None
        finally:
            store.close()


def run_memory_eval(cases: list[Case], memory: IncidentMemory | None = None) -> MemoryEval:
    from llama_index.core.schema import TextNode

    memory = memory or IncidentMemory()
    out = MemoryEval()
    for case in cases:
        if case.expect.component is None:
            continue  # healthy: nothing to remember
        row = remembered_incident(case)
        if row is None:
            continue
        out.items.append(Remembered(case.name, _family(case), row["incident_id"],
                                    row["fault_class"], describe(row)))
    memory.index.insert_nodes([TextNode(id_=it.case, text=it.text, metadata={
        "service": it.case, "fault_class": it.fault_class}) for it in out.items])
    by_case = {it.case: it for it in out.items}
    for it in out.items:
        # No floor here: the best score is kept even when the floor would refuse it.
        found = memory.recall(it.text, it.fault_class, exclude=[it.case], k=1, min_score=-1.0)
        best = found[0] if found else None
        near = by_case[best.incident_id] if best else None
        out.nearest[it.case] = (near if best and best.score >= memory.min_score else None,
                                best.score if best else 0.0)
    return out

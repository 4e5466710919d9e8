"""Incident memory: resolved incidents - what was seen, what was done, whether it held -
embedded with the project's embedding model and retrieved with llama-index, so an answer or a
remediation plan can say "seen before: inc-..., fixed by rollback, verified".

This module is what the server and the tools import (no llama-index at import time: it is
slow to load); the index itself is ``agents.memory_index``:

- Embeddings: all-MiniLM-L6-v2 (int8 ONNX, shipped in a PyPI package), run in-process through
  the serving backend the stack uses for ``minilm-l6-v2``, behind llama-index's
  ``BaseEmbedding``.
- Vectors: a DuckDB file of the memory's own (``<data_dir>/memory.duckdb``), behind
  llama-index's ``BasePydanticVectorStore``, queried with DuckDB's ``array_cosine_similarity``.
  (llama-index-vector-stores-duckdb pins duckdb<1.4, which the store's DuckDB 2 rules out.)
- Documents: built from the store on demand (``remember``): every resolved incident not yet
  indexed, with its top cause, evidence signals and the actions on it and how they ended.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops.analytics.incidents import IncidentEvidence
from aiops.store import Store

if TYPE_CHECKING:
    from agents.memory_index import IncidentMemory

__all__ = ["MIN_SCORE", "LazyMemory", "Recalled", "describe"]

log = logging.getLogger(__name__)

MIN_SCORE = 0.5  # cosine similarity below which a past incident is not "the same pattern"


@dataclass(frozen=True)
class Recalled:
    incident_id: str
    score: float
    service: str
    version: str | None
    fault_class: str | None
    fix: str | None  # "rollback", "scale", ... or None when nothing was done
    outcome: str | None  # verified, failed, executed, dry_run, ...

    def line(self) -> str:
        done = (f"fixed by {self.fix}, {self.outcome}" if self.fix and self.outcome == "verified"
                else f"{self.fix} {self.outcome}" if self.fix else "resolved without an action")
        where = self.service + (f"@{self.version}" if self.version else "")
        return (f"seen before: {self.incident_id} ({self.fault_class or 'anomaly'} on {where}), "
                f"{done} (similarity {self.score:.2f})")


RESOLVED_SQL = """
    SELECT i.incident_id, i.service, i.model_version, i.replica, i.fault_class, i.summary,
           i.evidence, strftime(i.closed_at, '%Y-%m-%dT%H:%M:%SZ') AS closed
    FROM incidents_current i
    WHERE i.status = 'resolved'
    ORDER BY i.closed_at"""
INCIDENT_SQL = """
    SELECT incident_id, service, model_version, replica, fault_class, summary, evidence
    FROM incidents_current WHERE incident_id = ?"""
ACTIONS_SQL = """
    SELECT incident_id, kind, status FROM actions_current
    WHERE incident_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY created_at"""


def describe(row: dict[str, Any]) -> str:
    """The text an incident is remembered (and recalled) by: what failed and how it showed."""
    try:  # the column's typed contract (aiops.analytics.incidents)
        evidence = IncidentEvidence.parse(row.get("evidence")).to_dict()
    except ValueError:
        evidence = {}
    causes = evidence.get("root_causes") or []
    top = causes[0] if causes else {}
    signals = sorted({str(e.get("signal") or e.get("kind")) for e in top.get("evidence", [])
                      if e.get("signal") or e.get("kind")})
    detectors = sorted(map(str, top.get("detectors", [])))
    parts = [f"{row.get('fault_class') or top.get('fault_class') or 'anomaly'} on "
             f"{row.get('service')}", str(row.get("summary") or "")]
    if detectors:
        parts.append("detected by " + ", ".join(detectors))
    if signals:
        parts.append("signals: " + ", ".join(signals[:8]))
    return ". ".join(p for p in parts if p)


class LazyMemory:
    """An ``IncidentMemory`` made on first use (loading the embedding model takes a moment
    the server need not spend at start-up); a memory that cannot be made is logged once and
    recalls nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: IncidentMemory | None = None
        self._failed = False
        self._lock = threading.Lock()

    def get(self, wait: bool = True) -> IncidentMemory | None:
        """The memory, loading it first if need be; with ``wait=False`` (the planner, which
        must not stall an analytics round) a memory not loaded yet starts loading in the
        background and this call returns None."""
        if not wait:
            if self._memory is None and not self._failed and not self._lock.locked():
                threading.Thread(target=self.get, name="memory-load", daemon=True).start()
            return self._memory
        with self._lock:
            if self._memory is None and not self._failed:
                try:
                    from agents.memory_index import IncidentMemory

                    self._memory = IncidentMemory(self.path)
                except Exception as exc:  # noqa: BLE001 - recall is an aid; answers go on
                    log.error("incident memory unavailable: %s", exc)
                    self._failed = True
            return self._memory

    def seen_before(self, store: Store, incident_id: str, wait: bool = True) -> str | None:
        """"seen before: inc-..., fixed by rollback, verified" for the best match, or None."""
        memory = self.get(wait)
        if memory is None:
            return None
        try:
            found = memory.similar(store, incident_id, k=1)
        except Exception as exc:  # noqa: BLE001 - a failed recall must not stop a plan
            log.warning("incident memory: recall for %s failed: %s", incident_id, exc)
            return None
        return found[0].line() if found else None

    def close(self) -> None:
        with self._lock:
            if self._memory is not None:
                self._memory.close()

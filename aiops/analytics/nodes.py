"""Findings about Ray nodes: a node that was lost, until the replicas it held run elsewhere.

The Serve driver (serve.nodes) writes one event record when a node of its cluster dies
(``aiops.node.lost``, with the replicas that ran on it) and one when each of those
deployments is back to its replica count on the nodes left (``aiops.node.replaced``). From
the first to the second, every lost replica's model version has a ``node`` finding naming
the node: the deepest cause of the failed requests and replica exits that come with it.
"""

from __future__ import annotations

import json
import logging

from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.schema import NODE_ATTR, NODE_LOST_EVENT, NODE_REPLACED_EVENT
from aiops.store import Store

__all__ = ["node_findings"]

log = logging.getLogger(__name__)

NS = 1_000_000_000
# A lost node outranks the symptoms it causes; score >= 1 fires.
SCORE = 10.0
MAX_REPLICAS = 64  # per event: a record's list is telemetry like any other, so it is bounded

_SQL = f"""
SELECT epoch_ns(time) AS t, event_name, (attributes->>'{NODE_ATTR}') AS node,
       (attributes->>'ray.node.id') AS node_id, (attributes->>'aiops.node.replicas') AS replicas
FROM logs
WHERE event_name IN ('{NODE_LOST_EVENT}', '{NODE_REPLACED_EVENT}')
  AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
ORDER BY time
"""


def node_findings(store: Store, now_ns: int, horizon_s: float = 900.0) -> list[Finding]:
    """One finding per replica of each node lost in the last ``horizon_s`` whose replicas
    are not all replaced yet. A node whose replicas never come back stops being reported
    after ``horizon_s`` (its incident resolves; the deployments' own SLIs carry on)."""
    lost: dict[str, tuple[int, str, list[dict[str, str]]]] = {}
    for t, event, node, node_id, replicas in store.query(
            _SQL, [now_ns - int(horizon_s * NS), now_ns]).rows:
        if not node:
            continue
        if event == NODE_LOST_EVENT:
            try:
                rows = json.loads(replicas or "[]")
                rows = rows if isinstance(rows, list) else []
            except ValueError:
                log.warning("unreadable replica list in the %s event of %s", event, node)
                rows = []
            held = [r for r in rows if isinstance(r, dict)][:MAX_REPLICAS]
            lost[node] = (int(t), node_id or "", held)
        else:
            lost.pop(node, None)
    found = []
    for node, (t, node_id, replicas) in lost.items():
        for r in replicas:
            if not r.get("model"):
                continue
            entity = Entity(r["model"], r.get("version"), r.get("replica"))
            since = (now_ns - t) / NS
            found.append(Finding(
                "node_lost", entity, FaultClass.NODE, SCORE, t, now_ns,
                f"Ray node {node} ({node_id[:12]}) was lost {since:.0f} s ago with replica "
                f"{r.get('replica')} of {entity.service}@{entity.version}; not yet replaced",
                [entity.evidence(EvidenceKind.EVENT, f"{NODE_LOST_EVENT} {node}",
                                 FaultClass.NODE, "node_alive", 0.0, 1.0, SCORE)],
                node=node))
    return found

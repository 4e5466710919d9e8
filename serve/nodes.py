"""Watching the Ray cluster's nodes from the Serve driver: loss and replacement events.

Each poll reads the nodes' liveness from the GCS (``ray.nodes()``; no dashboard needed). A
node that was alive and is no longer is *lost*: one ``aiops.node.lost`` record names it, with
the replicas that ran on it (from the replica list of the poll before) and each affected
deployment's replica count then. Once every such deployment is HEALTHY again with at least
that many live replicas, none of them on the lost node, one ``aiops.node.replaced``
record says so and how long it took. Live analytics hold a ``node`` finding open in between
(aiops/analytics/nodes.py). ``aiops.ray.node.alive`` is 1 per live node, 0 per lost one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation

from aiops.schema import NODE_ATTR, NODE_LOST_EVENT, NODE_REPLACED_EVENT
from serve.cluster import RayCluster
from serve.telemetry import Telemetry

__all__ = ["Lost", "NodeWatcher"]

log = logging.getLogger(__name__)


@dataclass
class Lost:
    name: str
    node_id: str
    lost_at: float
    replicas: list[dict[str, Any]]
    targets: dict[str, int] = field(default_factory=dict)  # deployment -> replicas before


def _alive_nodes() -> set[str] | None:
    import ray

    try:
        return {n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
                if n.get("Alive")}
    except Exception as exc:  # noqa: BLE001 - watching must never stop serving
        log.warning("ray.nodes() failed: %s", exc)
        return None


class NodeWatcher:
    def __init__(self, cluster: RayCluster, telemetry: Telemetry, nodes_file: Path | None,
                 alive: Callable[[], set[str] | None] = _alive_nodes,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.nodes_file = nodes_file
        self._read_alive = alive
        self.clock = clock
        self._logger = telemetry.logger_provider.get_logger("aiops.cluster")
        self.alive: set[str] = set(cluster.names)
        self.lost: dict[str, Lost] = {}
        self._rows: list[dict[str, Any]] = []
        self._running: dict[str, int] = {}
        telemetry.meter.create_observable_gauge(
            "aiops.ray.node.alive", callbacks=[self._observe], unit="1",
            description="1 for each live Ray node of the Serve cluster, 0 for a lost one")
        if nodes_file is not None:
            cluster.write(nodes_file, self.alive)

    def _observe(self, _: CallbackOptions) -> Iterable[Observation]:
        for node_id, name in self.cluster.names.items():
            yield Observation(int(node_id in self.alive), {NODE_ATTR: name,
                                                           "ray.node.id": node_id})

    def poll(self, rows: list[dict[str, Any]], running: dict[str, int],
             healthy: dict[str, bool]) -> None:
        """``rows``: the replica list as just read (serve.runner); ``running``: RUNNING
        replicas per deployment; ``healthy``: whether each deployment is HEALTHY."""
        alive = self._read_alive()
        if alive is None:
            return
        now = self.clock()
        for node_id in sorted(self.alive - alive):
            self._lose(node_id, now)
        self.alive = alive & set(self.cluster.names)
        for node_id, lost in list(self.lost.items()):
            if self._replaced(lost, rows, running, healthy):
                self._emit(NODE_REPLACED_EVENT, lost, now, SeverityNumber.INFO, (
                    f"the replicas Ray node {lost.name} held run again on the nodes left, "
                    f"{now - lost.lost_at:.0f} s after it was lost"),
                    {"aiops.node.replaced_after_s": round(now - lost.lost_at, 3)})
                del self.lost[node_id]
        if not self.lost:
            # The counts to come back to: what ran while every node was up.
            self._running = dict(running)
        self._rows = rows
        if self.nodes_file is not None:
            self.cluster.write(self.nodes_file, self.alive)

    def _lose(self, node_id: str, now: float) -> None:
        name = self.cluster.names.get(node_id, node_id[:12])
        held = [r for r in self._rows if r.get("node_id") == node_id]
        lost = Lost(name, node_id, now, held, {
            d: self._running.get(d, 1) for d in {str(r.get("deployment")) for r in held}})
        self.lost[node_id] = lost
        names = ", ".join((f"{r['model']}@{r.get('version')}" if r.get("model") else
                           str(r.get("deployment"))) + f"/{r.get('replica')}"
                          for r in held) or "no replicas"
        self._emit(NODE_LOST_EVENT, lost, now, SeverityNumber.ERROR,
                   f"Ray node {name} ({node_id[:12]}) was lost; it ran {names}", {})

    @staticmethod
    def _replaced(lost: Lost, rows: list[dict[str, Any]], running: dict[str, int],
                  healthy: dict[str, bool]) -> bool:
        if any(r.get("node_id") == lost.node_id for r in rows):
            return False  # the actor table still lists replicas there
        gone = {r.get("replica") for r in lost.replicas}
        # Serve's status lags the actor table by a poll or two (it still counts the lost
        # replicas as running right after the loss): the live replicas must be there too.
        live = {d: sum(1 for r in rows if r.get("deployment") == d
                       and r.get("replica") not in gone) for d in lost.targets}
        return all(healthy.get(d, False) and running.get(d, 0) >= n and live[d] >= n
                   for d, n in lost.targets.items())

    def _emit(self, event: str, lost: Lost, now: float, severity: SeverityNumber, body: str,
              extra: dict[str, Any]) -> None:
        replicas = [{k: r.get(k) for k in ("model", "version", "replica", "deployment")}
                    for r in lost.replicas]
        attributes = {NODE_ATTR: lost.name, "ray.node.id": lost.node_id,
                      "aiops.node.replicas": json.dumps(replicas), **extra}
        self._logger.emit(event_name=event, body=body, attributes=attributes,
                          severity_number=severity, severity_text=severity.name,
                          timestamp=int(now * 1e9))
        (log.error if severity is SeverityNumber.ERROR else log.info)("%s", body)

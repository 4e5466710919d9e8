"""The Serve driver's Ray: one local instance, or a multi-node cluster on this machine.

With ``ray_worker_nodes`` > 0 the driver starts a head node and that many worker nodes, each
a raylet of its own with its own logical CPUs: Ray's multi-node test cluster
(``ray.cluster_utils``), the same processes ``ray start --head`` and ``ray start --address``
run. Serve spreads replicas over the nodes. The head alone advertises room for every replica
(``ray_num_cpus``), so when a worker is lost its replicas have somewhere to go.

Nodes are named ``head``, ``worker-1``, ... (a node label, ``aiops.node.name``).
``<data_dir>/ray-nodes.json`` lists them with their Ray node id, raylet pid and liveness: the
per-node eBPF collectors and the node-loss scenario (``lose_node``) read it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiops.config import Settings
from aiops.datadir import NODES_FILE
from aiops.errors import StackError
from aiops.schema import NODE_ATTR

__all__ = ["HEAD", "NodeInfo", "RayCluster", "lose_node", "read_nodes", "start_ray"]

log = logging.getLogger(__name__)

HEAD = "head"
# How soon the GCS declares a node whose raylet stopped answering dead: every second, three
# misses (Ray's defaults, 3 s x 5, take 15 s before Serve even starts replacing replicas).
_HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@dataclass(frozen=True)
class NodeInfo:
    name: str
    node_id: str
    raylet_pid: int
    alive: bool = True


class RayCluster:
    """What the driver started: the names of its nodes, and how to stop them."""

    def __init__(self, names: dict[str, str], raylets: dict[str, int],
                 cluster: Any = None) -> None:
        self.names = names  # node id -> name
        self.raylets = raylets  # node id -> raylet pid
        self._cluster = cluster

    @property
    def multi_node(self) -> bool:
        return self._cluster is not None

    def nodes(self, alive: set[str] | None = None) -> list[NodeInfo]:
        return [NodeInfo(name, node_id, self.raylets.get(node_id, 0),
                         alive is None or node_id in alive)
                for node_id, name in self.names.items()]

    def write(self, path: Path, alive: set[str] | None = None) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(n) for n in self.nodes(alive)], indent=1))
        tmp.replace(path)

    def shutdown(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()


def _raylet_pid(node: Any) -> int:
    from ray._private import ray_constants

    procs = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
    return int(procs[0].process.pid) if procs else 0


def start_ray(settings: Settings, namespace: str) -> RayCluster:
    """Start Ray for the driver and connect to it; never joins someone else's cluster."""
    import ray

    common: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if settings.ray_worker_nodes == 0:
        # address="local" always starts a new instance.
        ray.init(address="local", num_cpus=settings.ray_num_cpus, namespace=namespace,
                 _metrics_export_port=settings.ray_metrics_port, **common)
        node_id = ray.get_runtime_context().get_node_id()
        return RayCluster({node_id: HEAD}, {node_id: _own_raylet(node_id)})
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": settings.ray_num_cpus, "labels": {NODE_ATTR: HEAD},
        "metrics_export_port": settings.ray_metrics_port, "include_dashboard": False,
        "_system_config": _HEALTH})
    head: Any = cluster.head_node
    names, raylets = {head.node_id: HEAD}, {head.node_id: _raylet_pid(head)}
    try:
        for i in range(1, settings.ray_worker_nodes + 1):
            node = cluster.add_node(num_cpus=settings.ray_num_cpus,
                                    labels={NODE_ATTR: f"worker-{i}"})
            names[node.node_id], raylets[node.node_id] = f"worker-{i}", _raylet_pid(node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=namespace,
                 logging_level=logging.WARNING)
    except BaseException:
        cluster.shutdown()  # type: ignore[no-untyped-call]
        raise
    log.info("Ray cluster of %d nodes: %s", len(names), ", ".join(names.values()))
    return RayCluster(names, raylets, cluster)


def _own_raylet(node_id: str) -> int:
    """The local instance's raylet pid (a child of this driver's session)."""
    import ray

    for n in ray.nodes():  # type: ignore[no-untyped-call]
        if n.get("NodeID") == node_id:
            return int(n.get("RayletPid") or 0) if "RayletPid" in n else 0
    return 0


def read_nodes(data_dir: Path) -> list[NodeInfo]:
    path = data_dir / NODES_FILE
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StackError(f"no Ray node list at {path} ({exc}): is the stack up?") from exc
    return [NodeInfo(**r) for r in rows]


def _descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    """Every live process under ``root`` (children, theirs, ...), from /proc's ppids."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def lose_node(data_dir: Path, name: str) -> NodeInfo:
    """Take a worker node down as a machine that dies would: SIGKILL its raylet and every
    process it started (the workers, its replicas and HTTP proxy among them, its agents) at
    once. Killing the raylet alone leaves those running as orphans, still bound to the
    proxy's port. The head cannot be lost: it holds the cluster's GCS."""
    if name == HEAD:
        raise StackError("the head node holds the cluster's GCS: lose a worker node instead")
    nodes = {n.name: n for n in read_nodes(data_dir)}
    node = nodes.get(name)
    if node is None or not node.raylet_pid:
        raise StackError(f"no Ray node {name!r} to lose (nodes: {', '.join(nodes) or 'none'})")
    if not node.alive:
        raise StackError(f"Ray node {name} is already lost")
    victims = [node.raylet_pid, *_descendants(node.raylet_pid)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    log.warning("lost Ray node %s: killed its raylet (pid %d) and %d processes under it",
                name, node.raylet_pid, len(victims) - 1)
    return node

"""The hand-off files in the data dir: one process writes them, another reads them.

Serving (``serve.runner``, ``serve.cluster``) and the attach watcher write who runs where; the
eBPF collector reads it to attribute kernel measurements to replicas
(``collectors.ebpf.attribution``). The names live here, below both sides, so that neither
imports the other.
"""

from __future__ import annotations

__all__ = ["ATTACHED_REPLICAS_FILE", "NODES_FILE", "REPLICAS_FILE"]

REPLICAS_FILE = "serve-replicas.json"  # Serve's replicas, written by serve.runner
ATTACHED_REPLICAS_FILE = "attach-replicas.json"  # attached clusters' replicas, by aiops.attach
NODES_FILE = "ray-nodes.json"  # the Ray nodes, written by serve.runner (serve.cluster)

"""Who a kernel measurement belongs to: thread -> process -> Ray Serve replica.

The Serve driver writes ``<data_dir>/serve-replicas.json`` from Ray's actor table (pid, app,
deployment, replica id, model, version); the server writes ``<data_dir>/attach-replicas.json``
the same way for the Ray clusters it is attached to (docs/attach.md), each row with the
node's address, so a collector takes only its own node's pids. With worker nodes on one
machine (``ray_worker_nodes``) each collector covers one node (``ebpf_node``): the replicas
the actor table places there, and the processes under that node's raylet (from
``<data_dir>/ray-nodes.json``); everything under no worker's raylet is the head's.
Processes neither lists but
whose title Ray set (``ray::ServeReplica:<app>:<deployment>``) still get their app and
deployment; everything else is named by its command. All of it comes from /proc and those
files: nothing here needs Ray, so the collector runs (as root) outside the Ray cluster.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The data dir's hand-off files (their names are the foundation's: serve writes them too).
from aiops import identity, semconv
from aiops.datadir import ATTACHED_REPLICAS_FILE, NODES_FILE, REPLICAS_FILE

__all__ = ["ATTACHED_REPLICAS_FILE", "HEAD_NODE", "NODES_FILE", "REPLICAS_FILE", "ProcessInfo",
           "Processes", "local_addresses"]

log = logging.getLogger(__name__)

HEAD_NODE = "head"


def local_addresses(proc: Path = Path("/proc")) -> set[str]:
    """This host's IP addresses (IPv4 from the kernel's local routes, IPv6 from its
    interfaces), to tell this node's replicas from another node's with the same pid."""
    out = {"127.0.0.1", "::1"}
    try:
        lines = (proc / "net" / "fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for prev, line in itertools.pairwise(lines):
        if line.strip() == "/32 host LOCAL":
            out.add(prev.strip().removeprefix("|-- ").strip())
    try:
        for row in (proc / "net" / "if_inet6").read_text().splitlines():
            out.add(str(ipaddress.IPv6Address(int(row.split()[0], 16))))
    except (OSError, ValueError, IndexError):
        pass
    return out
_TITLE_PREFIX = "ray::ServeReplica:"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    comm: str
    app: str | None = None
    deployment: str | None = None
    replica: str | None = None
    model: str | None = None
    version: str | None = None

    def attributes(self) -> dict[str, str | int]:
        """OTel attribute names, the same the replicas put on their own telemetry."""
        out: dict[str, str | int] = {"process.pid": self.pid, "process.command": self.comm}
        for key, value in ((identity.APP, self.app), (identity.DEPLOYMENT, self.deployment),
                           (identity.REPLICA, self.replica),
                           (semconv.MODEL_ATTR, self.model),
                           (semconv.MODEL_VERSION_ATTR, self.version)):
            if value:
                out[key] = value
        return out


_DEPARTED = 256
_OWNERS = 16_384  # cached pid -> node answers


class Processes:
    """Caches tid -> tgid and tgid -> ProcessInfo; ``forget`` on exit keeps pid reuse honest."""

    def __init__(self, replicas_file: Path | Sequence[Path] | None = None,
                 proc: Path = Path("/proc"), node: str | None = None,
                 nodes_file: Path | None = None) -> None:
        self.replicas_files = ([] if replicas_file is None else [replicas_file]
                               if isinstance(replicas_file, Path) else list(replicas_file))
        self.proc = proc
        self.node = node
        self.nodes_file = nodes_file
        self._foreign: set[int] = set()  # other nodes' replicas
        self._raylets: dict[int, str] = {}  # raylet pid -> node name
        self._nodes_mtime = 0.0
        self._owner: dict[int, str] = {}
        self._replicas: dict[int, dict[str, str | None]] = {}
        self._replicas_mtime: tuple[float, ...] = ()
        self._tgid: dict[int, int] = {}
        self._info: dict[int, ProcessInfo] = {}
        self._departed: dict[int, dict[str, str | None]] = {}

    def refresh(self) -> None:
        """Re-read the replica files when one changed (their writers rewrite them every few
        s); a row for another node's address is not this node's process."""
        mtimes = []
        for path in self.replicas_files:
            try:
                mtimes.append(path.stat().st_mtime)
            except FileNotFoundError:
                mtimes.append(0.0)
        self._refresh_nodes()
        if tuple(mtimes) == self._replicas_mtime:
            return
        here = local_addresses(self.proc)
        replicas: dict[int, dict[str, str | None]] = {}
        foreign: set[int] = set()
        for path, mtime in zip(self.replicas_files, mtimes, strict=True):
            if not mtime:
                continue
            try:
                rows = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("unreadable %s: %s", path, exc)
                return  # half-written: read again next time
            for r in rows if isinstance(rows, list) else []:
                if not isinstance(r, dict) or "pid" not in r:
                    continue
                if self.node is not None and r.get("node") not in (None, self.node):
                    foreign.add(int(r["pid"]))
                elif r.get("node_ip") in (None, *here):
                    replicas[int(r["pid"])] = r
        self._replicas_mtime = tuple(mtimes)
        self._foreign = foreign
        # A replica that crashed drops out of the file, often before its exit event is
        # drained: keep what it was until that exit is seen (``forget``), at most _DEPARTED.
        for pid, row in self._replicas.items():
            if pid not in replicas:
                self._departed[pid] = row
        while len(self._departed) > _DEPARTED:
            self._departed.pop(next(iter(self._departed)))
        self._replicas = replicas
        self._info.clear()  # a replica may have moved into a known pid

    def _refresh_nodes(self) -> None:
        if self.node is None or self.nodes_file is None:
            return
        try:
            mtime = self.nodes_file.stat().st_mtime
            if mtime == self._nodes_mtime:
                return
            rows = json.loads(self.nodes_file.read_text())
        except (OSError, ValueError):
            return  # not written yet, or half-written: read again next time
        self._nodes_mtime = mtime
        raylets = {int(r["raylet_pid"]): str(r["name"]) for r in rows
                   if isinstance(r, dict) and r.get("raylet_pid") and r.get("name")}
        if raylets != self._raylets:
            self._raylets, self._owner = raylets, {}

    def mine(self, pid: int) -> bool:
        """Whether ``pid`` is this collector's node's (always, without a node set)."""
        if self.node is None or pid in self._replicas:
            return True
        if pid in self._foreign:
            return False
        return self._owner_of(pid) == self.node

    def _owner_of(self, pid: int) -> str:
        """The node whose raylet ``pid`` descends from; the head for everything else."""
        if pid in self._owner:
            return self._owner[pid]
        chain, cur, owner = [], pid, HEAD_NODE
        for _ in range(64):  # a process tree is shallow; a loop in /proc is not possible
            if cur in self._raylets:
                owner = self._raylets[cur]
                break
            if cur in self._owner:
                owner = self._owner[cur]
                break
            chain.append(cur)
            ppid = self._ppid(cur)
            if ppid is None or ppid <= 1:
                break
            cur = ppid
        for p in chain:
            self._owner[p] = owner
        if len(self._owner) > _OWNERS:
            self._owner.clear()  # bounded: pids come and go
        return owner

    def _ppid(self, pid: int) -> int | None:
        for line in self._read_lines(self.proc / str(pid) / "status"):
            if line.startswith("PPid:"):
                return int(line.split()[1])
        return None

    def tgid_of(self, tid: int) -> int | None:
        if tid in self._tgid:
            return self._tgid[tid]
        try:
            status = (self.proc / str(tid) / "status").read_text()
        except OSError:
            return None  # gone already: its samples are dropped with it
        for line in status.splitlines():
            if line.startswith("Tgid:"):
                tgid = int(line.split()[1])
                self._tgid[tid] = tgid
                return tgid
        return None

    def info(self, pid: int) -> ProcessInfo:
        cached = self._info.get(pid)
        if cached is not None:
            return cached
        comm = self._read(pid, "comm").strip() or "?"
        replica = self._replicas.get(pid) or self._departed.get(pid)
        if replica is not None:
            info = ProcessInfo(pid, comm, replica.get("app"), replica.get("deployment"),
                               replica.get("replica"), replica.get("model"),
                               replica.get("version"))
        else:
            info = _from_title(pid, comm, self._read(pid, "cmdline"))
        self._info[pid] = info
        return info

    def replica_pids(self) -> list[int]:
        """The pids the replica files name on this node (as of the last ``refresh``)."""
        return sorted(self._replicas)

    def forget(self, pid: int) -> None:
        self._info.pop(pid, None)
        self._owner.pop(pid, None)
        self._departed.pop(pid, None)
        for tid in [t for t, g in self._tgid.items() if g == pid]:
            del self._tgid[tid]

    def owner_of_port(self, local_port: int) -> int | None:
        """The process holding a TCP socket bound to ``local_port`` (retransmits fire in
        softirq context, where the current pid says nothing)."""
        inodes = set()
        for table in ("net/tcp", "net/tcp6"):
            for line in self._read_lines(self.proc / table)[1:]:
                fields = line.split()
                if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == local_port:
                    inodes.add(f"socket:[{fields[9]}]")
        if not inodes:
            return None
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                for fd in (entry / "fd").iterdir():
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
            except OSError:
                continue
        return None

    def _read(self, pid: int, name: str) -> str:
        try:
            return (self.proc / str(pid) / name).read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _read_lines(path: Path) -> list[str]:
        try:
            return path.read_text().splitlines()
        except OSError:
            return []


def _from_title(pid: int, comm: str, cmdline: str) -> ProcessInfo:
    title = cmdline.strip()
    if not title.startswith(_TITLE_PREFIX):
        return ProcessInfo(pid, comm)
    app, _, deployment = title.removeprefix(_TITLE_PREFIX).split(" ")[0].partition(":")
    # Ray appends the running method: "ray::ServeReplica:app:Deployment.handle_request".
    return ProcessInfo(pid, comm, app or None, deployment.split(".")[0] or None)

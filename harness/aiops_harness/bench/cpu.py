"""Who used the cores during a benchmark row: CPU time per process role, from /proc.

A latency figure says a request waited; this says for whom. Ray names its worker processes
after the actor they host (``ray::ServeReplica:<app>:<deployment>``, ``ray::ProxyActor``), so
the roles of a Serve benchmark are found by command line. Linux only; elsewhere the
snapshot is empty and the report says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuSnapshot", "Role", "cores_used", "snapshot"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Role:
    """A named group of processes: ``matches(pid, cmdline)`` says whether a process is one."""

    name: str
    matches: Callable[[int, str], bool]


@dataclass(frozen=True)
class CpuSnapshot:
    at: float  # time.monotonic()
    cpu_s: dict[int, tuple[str, float]]  # pid -> (role, user + system seconds so far)


def _cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may hold spaces): utime is the
    # 14th field of the line, stime the 15th.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


def snapshot(roles: Sequence[Role], other: str = "other") -> CpuSnapshot:
    """CPU seconds of every process now, each under the first role it matches."""
    import time

    out: dict[int, tuple[str, float]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            cpu = _cpu_seconds(pid)
            if cpu is None:
                continue
            line = _cmdline(pid)
            role = next((r.name for r in roles if r.matches(pid, line)), other)
            out[pid] = (role, cpu)
    return CpuSnapshot(time.monotonic(), out)


def cores_used(before: CpuSnapshot, after: CpuSnapshot) -> Mapping[str, float]:
    """CPU used between the snapshots per role, in cores (CPU seconds per wall second),
    largest first. A process that started in between counts from zero; one that ended in
    between is missing (its time is lost, a small undercount)."""
    wall = after.at - before.at
    if wall <= 0:
        return {}
    used: dict[str, float] = {}
    for pid, (role, cpu) in after.cpu_s.items():
        start = before.cpu_s.get(pid, (role, 0.0))[1]
        used[role] = used.get(role, 0.0) + max(0.0, cpu - start) / wall
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))

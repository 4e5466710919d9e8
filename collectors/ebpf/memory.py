"""Resident memory and CPU time of each Serve replica on this node, from /proc (no eBPF).

A leak shows as resident memory that keeps growing; the kernel's OOM kill comes much later, and
often nothing in the replica's latency or errors shows it before then. ``/proc/<pid>/statm``
gives the resident set in pages. A replica whose own work got heavier burns more CPU per
second, which ``/proc/<pid>/stat`` (user + system time) shows whether or not the CPUs are
contended (run-queue waits only rise when they are). Both are read once per collector
interval per replica.
"""

from __future__ import annotations

import os
from pathlib import Path

from collectors.ebpf.attribution import Processes
from collectors.ebpf.probes import Measurement

__all__ = ["CPU_METRIC", "RSS_METRIC", "CpuTimes", "replica_rss"]

RSS_METRIC = "aiops.process.memory.rss"  # bytes, a gauge per replica process
CPU_METRIC = "aiops.process.cpu.time"  # seconds of CPU per interval, a delta counter
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def replica_rss(procs: Processes, proc: Path = Path("/proc")) -> list[Measurement]:
    out = []
    for pid in procs.replica_pids():
        try:
            resident_pages = int((proc / str(pid) / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone since the replica file was written: its exit is reported apart
        out.append(Measurement(RSS_METRIC, procs.info(pid).attributes(),
                               value=float(resident_pages * _PAGE), gauge=True,
                               unit="By"))
    return out


class CpuTimes:
    """CPU seconds each replica used since the last call (nothing on a replica's first)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last: dict[int, float] = {}

    def _read(self, pid: int) -> float | None:
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
            # Fields after the command (which may hold spaces), utime and stime at 14, 15.
            fields = stat[stat.rindex(")") + 2:].split()
            return (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, ValueError, IndexError):
            return None

    def collect(self, procs: Processes) -> list[Measurement]:
        out, now = [], {}
        for pid in procs.replica_pids():
            used = self._read(pid)
            if used is None:
                continue
            now[pid] = used
            if pid in self._last and used >= self._last[pid]:
                out.append(Measurement(CPU_METRIC, procs.info(pid).attributes(),
                                       value=used - self._last[pid], unit="s"))
        self._last = now
        return out

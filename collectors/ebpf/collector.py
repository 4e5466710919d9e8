"""The eBPF collector: attach the probes, drain them every few seconds, ship OTLP metrics.

Collectors log, count and carry on: a probe that fails to attach is counted and skipped, a
full map is counted (drops), a failed export is counted and that cycle's points are dropped.
What cannot work at all (not root, no bcc, no tracefs, no kernel headers) is found by
``preflight`` before anything is loaded and reported as one sentence per problem.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
import ssl
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from collectors.ebpf.attribution import Processes
from collectors.ebpf.export import build_request, send
from collectors.ebpf.memory import CpuTimes, replica_rss
from collectors.ebpf.probes import PROBES, Measurement, Probe, ProbeError

__all__ = ["READY_FILE", "CollectorStats", "EbpfCollector", "kernel_source", "preflight",
           "ready_file"]

log = logging.getLogger(__name__)

READY_FILE = "ebpf.ready"  # in the data dir, while the collector runs


def ready_file(node: str | None) -> str:
    """The ready marker's name: one per collector, so one per node when there are several."""
    return f"ebpf-{node}.ready" if node else READY_FILE
REPO_HEADERS = Path(__file__).resolve().parents[2] / ".build" / "kernel-headers"
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def kernel_source(configured: Path | None) -> Path | None:
    """Where bcc finds kernel headers: the configured tree, the running kernel's own
    (/lib/modules/<release>/build), or the merged Debian tree from `make ebpf-headers`."""
    candidates = [configured] if configured else [
        Path("/lib/modules") / platform.release() / "build", REPO_HEADERS]
    for path in candidates:
        if path is not None and (path / "include").is_dir():
            return path
    return None


def _mount_tracefs() -> bool:
    """bcc reads tracepoint formats from tracefs; containers often start without it."""
    if any((d / "events").is_dir() for d in TRACEFS_DIRS):
        return True
    for fs, target in (("debugfs", "/sys/kernel/debug"), ("tracefs", "/sys/kernel/tracing")):
        subprocess.run(["mount", "-t", fs, "nodev", target], capture_output=True, check=False)
    return any((d / "events").is_dir() for d in TRACEFS_DIRS)


def preflight(configured_headers: Path | None = None) -> list[str]:
    """Why the collector cannot run here: an empty list when it can."""
    if os.geteuid() != 0:
        return ["the eBPF collector needs root (loading BPF programs needs CAP_BPF and "
                "CAP_PERFMON): run it as root, or set AIOPS_EBPF=off"]
    problems = []
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        problems.append(f"bcc is not importable ({exc}): install Debian's python3-bpfcc; "
                        "`make install` as root does, and links it into the virtualenv")
    if not _mount_tracefs():
        problems.append("tracefs is not mounted and could not be mounted at "
                        "/sys/kernel/tracing: tracepoint formats are unreadable")
    if kernel_source(configured_headers) is None:
        where = configured_headers or (f"/lib/modules/{platform.release()}/build or "
                                       f"{REPO_HEADERS}")
        problems.append(f"no kernel headers at {where}: run `make ebpf-headers` as root "
                        "(a merged tree of Debian's linux-headers packages)")
    if not Path("/sys/fs/bpf").exists() and not Path("/proc/sys/kernel/bpf_stats_enabled"
                                                     ).exists():
        problems.append("this kernel has no BPF support (no /sys/fs/bpf, no bpf sysctls)")
    return problems


@dataclass
class CollectorStats:
    cycles: int = 0
    points_sent: int = 0
    export_failures: int = 0
    attach_failures: dict[str, str] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)


class EbpfCollector:
    def __init__(self, server_url: str, interval_s: float = 5.0, max_entries: int = 8192,
                 replicas_file: Path | Sequence[Path] | None = None,
                 headers: Path | None = None,
                 probes: tuple[type[Probe], ...] = PROBES,
                 verify: ssl.SSLContext | bool = True, token: str | None = None,
                 node: str | None = None, nodes_file: Path | None = None) -> None:
        self.server_url = server_url
        self.interval_s = interval_s
        self.node = node  # one collector per Ray node: only that node's processes
        self.procs = Processes(replicas_file, node=node, nodes_file=nodes_file)
        self._cpu_times = CpuTimes()
        self.stats = CollectorStats()
        source = kernel_source(headers)
        if source is not None:
            os.environ["BCC_KERNEL_SOURCE"] = str(source)
        self.probes: list[Probe] = []
        for cls in probes:
            probe = cls(max_entries)
            try:
                probe.load()
            except ProbeError as exc:
                log.warning("probe %s not attached: %s", cls.name, exc)
                self.stats.attach_failures[cls.name] = str(exc).splitlines()[0][:300]
                continue
            self.probes.append(probe)
            log.info("probe %s attached: %s", cls.name, cls.description)
        self._client = httpx.Client(
            timeout=10.0, verify=verify,
            headers={"authorization": f"Bearer {token}"} if token else None)
        self._last_ns = time.time_ns()
        self._last_cpu = _cpu_seconds()

    def collect(self) -> list[Measurement]:
        """Drain every probe once, plus the collector's own health counters."""
        self.procs.refresh()
        out: list[Measurement] = []
        for probe in self.probes:
            try:
                out.extend(probe.drain(self.procs))
                dropped = probe.drops()
            except Exception:  # one bad probe must not stop the others
                log.exception("draining probe %s failed", probe.name)
                continue
            if dropped:
                self.stats.drops[probe.name] = self.stats.drops.get(probe.name, 0) + dropped
                log.warning("probe %s lost %d updates (full map or perf buffer)",
                            probe.name, dropped)
            out.append(Measurement("aiops.ebpf.collector.drops", {"probe": probe.name},
                                   value=float(dropped)))
        for probe in self.probes:
            out.append(Measurement("aiops.ebpf.collector.probe_attached", {"probe": probe.name},
                                   value=1.0, gauge=True))
        for name, reason in self.stats.attach_failures.items():
            out.append(Measurement("aiops.ebpf.collector.probe_attached",
                                   {"probe": name, "error": reason}, value=0.0, gauge=True))
        out.extend(replica_rss(self.procs))
        out.extend(self._cpu_times.collect(self.procs))
        if self.node is not None:
            # The kernel is the machine's: another node's processes are its collector's.
            out = [m for m in out if m.name.startswith("aiops.ebpf.collector.")
                   or not isinstance(pid := m.attributes.get("process.pid"), int)
                   or self.procs.mine(pid)]
        cpu = _cpu_seconds()
        out.append(Measurement("aiops.ebpf.collector.cpu_seconds", {"process.pid": os.getpid()},
                               value=cpu - self._last_cpu))
        self._last_cpu = cpu
        return out

    def cycle(self) -> int:
        """One drain and export; returns the points sent (0 when the export failed)."""
        measurements = self.collect()
        now = time.time_ns()
        request = build_request(measurements, self._last_ns, now, node=self.node)
        self._last_ns = now
        self.stats.cycles += 1
        try:
            send(self._client, self.server_url, request)
        except httpx.HTTPError as exc:
            self.stats.export_failures += 1
            log.warning("export to %s failed (%s); %d points dropped", self.server_url, exc,
                        len(measurements))
            return 0
        self.stats.points_sent += len(measurements)
        return len(measurements)

    def run(self, stop: threading.Event, ready_file: Path | None = None) -> None:
        if ready_file is not None:
            ready_file.write_text("ready\n")
        try:
            while not stop.wait(self.interval_s):
                self.cycle()
            self.cycle()  # what the last interval saw
        finally:
            if ready_file is not None:
                ready_file.unlink(missing_ok=True)

    def close(self) -> None:
        for probe in self.probes:
            probe.close()
        self._client.close()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

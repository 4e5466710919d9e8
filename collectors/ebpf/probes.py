"""The bcc programs and how their maps become measurements.

Each probe is its own BPF module (bpf/<name>.bpf.c, with bpf/common.h prepended), so one that
fails to compile or attach is counted and skipped while the others run. Maps are bounded and
drained every cycle with lookup-and-delete, so each cycle reports what happened since the last.
Programs read tracepoint fields only: the header tree may not match the running kernel, which
makes struct offsets wrong, while tracepoint formats come from the kernel itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.ebpf.attribution import Processes

__all__ = ["PROBES", "Measurement", "Probe", "ProbeError", "exit_status"]

log = logging.getLogger(__name__)

BPF_DIR = Path(__file__).parent / "bpf"
SLOTS = 24
# Upper bounds in seconds of the log2 microsecond slots: slot 0 holds [0, 2) us, slot k
# [2^k, 2^(k+1)) us; the last slot is open-ended (+Inf in OTLP).
BOUNDS_S = tuple(2.0 ** (k + 1) / 1e6 for k in range(SLOTS - 1))
TCP_STATES = ("", "established", "syn_sent", "syn_recv", "fin_wait1", "fin_wait2", "time_wait",
              "close", "close_wait", "last_ack", "listen", "closing", "new_syn_recv")


class ProbeError(Exception):
    """A probe could not be compiled or attached."""


@dataclass
class Measurement:
    """One OTLP data point: a delta histogram (seconds), a delta counter or a gauge."""

    name: str
    attributes: dict[str, str | int]
    count: int = 0
    sum: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)
    value: float | None = None  # set for counters and gauges
    gauge: bool = False  # a current state (e.g. probe attached), not a count of events
    unit: str | None = None  # UCUM; default: s (histograms), 1 (gauges), {event} (counters)

    @property
    def is_histogram(self) -> bool:
        return self.value is None


class Probe(ABC):
    name: str
    source: str
    description: str
    cflags: tuple[str, ...] = ()

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.bpf: Any = None

    def load(self) -> None:
        from bcc import BPF

        text = (BPF_DIR / "common.h").read_text() + (BPF_DIR / self.source).read_text()
        flags = [f"-DMAX_ENTRIES={self.max_entries}", f"-DSLOTS={SLOTS}",
                 f"-DSELF_TGID={os.getpid()}", *self.cflags]
        try:  # bcc wants the text as bytes (str is deprecated there) and cflags as str
            self.bpf = BPF(text=text.encode(), cflags=flags)
        except Exception as exc:  # bcc raises bare Exception for compile and attach errors
            raise ProbeError(f"{self.name}: {exc}") from exc

    def drops(self) -> int:
        """Updates lost to a full map since the last call."""
        table = self.bpf[b"drops"]
        total = int(sum(table[0]))
        table.clear()
        return total

    @abstractmethod
    def drain(self, procs: Processes) -> list[Measurement]: ...

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None


def _drain(table: Any) -> list[tuple[Any, Any]]:
    try:
        return list(table.items_lookup_and_delete_batch())
    except Exception:  # noqa: BLE001 - kernels without batch ops: read, then clear
        items = list(table.items())
        table.clear()
        return items


def _int(v: Any) -> int:
    """Batch lookups give plain ints for scalar keys and values, item lookups ctypes."""
    return v if isinstance(v, int) else int(v.value)


def _merge(values: Any) -> tuple[int, int, list[int]]:
    """count, sum_ns and slots of a latency value, summed over CPUs for per-CPU maps."""
    per_cpu = values if isinstance(values, ctypes.Array) else [values]
    count = sum(int(v.count) for v in per_cpu)
    sum_ns = sum(int(v.sum_ns) for v in per_cpu)
    slots = [sum(int(v.slots[i]) for v in per_cpu) for i in range(SLOTS)]
    return count, sum_ns, slots


class _LatencyProbe(Probe):
    metric: str
    scale = 1  # a sampling probe's counts are multiplied back by its sampling interval

    def drain(self, procs: Processes) -> list[Measurement]:
        merged: dict[tuple[tuple[str, str | int], ...], Measurement] = {}
        for key, values in _drain(self.bpf[b"latency"]):
            count, sum_ns, slots = _merge(values)
            if count == 0:
                continue
            attrs = self.attributes(_int(key), procs)
            if attrs is None:
                continue
            m = merged.setdefault(tuple(sorted(attrs.items())), Measurement(
                self.metric, attrs, bucket_counts=[0] * SLOTS))
            m.count += count * self.scale
            m.sum += sum_ns * self.scale / 1e9
            m.bucket_counts = [a + b * self.scale
                               for a, b in zip(m.bucket_counts, slots, strict=True)]
        return list(merged.values())

    @abstractmethod
    def attributes(self, key: int, procs: Processes) -> dict[str, str | int] | None: ...


class RunQueueLatency(_LatencyProbe):
    name = "runq"
    source = "runq.bpf.c"
    metric = "aiops.ebpf.runq.latency"
    description = "Run-queue latency: wakeup to running (sched_wakeup, sched_switch)"

    def attributes(self, key: int, procs: Processes) -> dict[str, str | int] | None:
        tgid = procs.tgid_of(key)  # keyed by thread: sched_switch names the next thread only
        return None if tgid is None else procs.info(tgid).attributes()


class SyscallLatency(_LatencyProbe):
    name = "syscall"
    source = "syscall.bpf.c"
    metric = "aiops.ebpf.syscall.latency"
    description = "Syscall latency per process, sampled (raw_syscalls sys_enter/sys_exit)"
    SAMPLE_EVERY = 8
    # The hottest path: per-CPU counters (no atomics, no shared cache lines), and sampling.
    cflags = ("-DAIOPS_PERCPU", f"-DSAMPLE_EVERY={SAMPLE_EVERY}")
    scale = SAMPLE_EVERY

    def attributes(self, key: int, procs: Processes) -> dict[str, str | int] | None:
        return procs.info(key).attributes()


class BlockLatency(_LatencyProbe):
    name = "block"
    source = "block.bpf.c"
    metric = "aiops.ebpf.block.latency"
    description = "Block I/O latency per device (block_rq_issue/complete)"

    def drain(self, procs: Processes) -> list[Measurement]:
        self._issuers = {_int(k): _int(v) for k, v in _drain(self.bpf[b"issuers"])}
        return super().drain(procs)

    def attributes(self, key: int, procs: Processes) -> dict[str, str | int] | None:
        out: dict[str, str | int] = {"disk.device": f"{key >> 20}:{key & 0xFFFFF}"}
        issuer = self._issuers.get(key)
        if issuer:
            out.update({f"issuer.{k}": v for k, v in procs.info(issuer).attributes().items()})
        return out


class TcpEvents(Probe):
    name = "tcp"
    source = "tcp.bpf.c"
    description = "TCP retransmits and state changes (tcp_retransmit_skb, inet_sock_set_state)"

    def drain(self, procs: Processes) -> list[Measurement]:
        out = []
        for key, value in _drain(self.bpf[b"tcp_events"]):
            attrs: dict[str, str | int] = {"network.local.port": int(key.sport),
                                           "network.peer.port": int(key.dport)}
            if int(key.event) == 1:
                name = "aiops.ebpf.tcp.retransmits"
                attrs["tcp.state"] = _state(key.newstate)
                owner = procs.owner_of_port(int(key.sport))
            else:
                name = "aiops.ebpf.tcp.state_changes"
                attrs["tcp.old_state"] = _state(key.oldstate)
                attrs["tcp.new_state"] = _state(key.newstate)
                owner = int(key.tgid) or None
            if owner:
                attrs.update(procs.info(owner).attributes())
            out.append(Measurement(name, attrs, value=float(_int(value))))
        return out


def _state(code: int) -> str:
    return TCP_STATES[code] if 0 < code < len(TCP_STATES) else str(code)


def exit_status(code: int) -> str:
    """How a process ended, in words: ``clean`` (exit 0), ``error:N`` (exit N),
    ``signal:N`` (signal N was its last, and it did not exit on its own) or ``unknown``."""
    if code < 0:
        return "unknown"
    if code & 0x7F:
        return f"signal:{code & 0x7F}"
    return "clean" if code == 0 else f"error:{(code >> 8) & 0xFF}"


class ProcessEvents(Probe):
    name = "process"
    source = "process.bpf.c"
    description = ("Process exec and exit with how it ended, OOM-kill victims (sched_process_*, "
                   "exit_group, signal_generate, oom:mark_victim)")
    KINDS = {1: "aiops.ebpf.process.execs", 2: "aiops.ebpf.process.exits",
             3: "aiops.ebpf.oom.kills"}

    def load(self) -> None:
        super().load()
        self._events: list[tuple[int, int, str, int]] = []
        self.lost = 0

        def on_event(_cpu: int, data: Any, _size: int) -> None:
            e = self.bpf[b"proc_events"].event(data)
            self._events.append((int(e.kind), int(e.pid), e.comm.decode(errors="replace"),
                                 int(e.code)))

        def on_lost(count: int) -> None:
            self.lost += count

        self.bpf[b"proc_events"].open_perf_buffer(on_event, page_cnt=64, lost_cb=on_lost)

    def drain(self, procs: Processes) -> list[Measurement]:
        self.bpf.perf_buffer_poll(timeout=0)
        events, self._events = self._events, []
        counts: dict[tuple[tuple[str, str | int], ...], Measurement] = {}
        for kind, pid, comm, code in events:
            info = procs.info(pid)
            # An exited process's /proc entry may be gone already: keep the kernel's comm.
            attrs = {**info.attributes(), "process.command": comm or info.comm}
            if kind == 2:
                attrs["process.exit.status"] = exit_status(code)
            m = counts.setdefault((("kind", kind), *sorted(attrs.items())),
                                  Measurement(self.KINDS[kind], attrs, value=0.0))
            m.value = (m.value or 0.0) + 1
            if kind == 2:
                procs.forget(pid)
        return list(counts.values())

    def drops(self) -> int:
        lost, self.lost = self.lost, 0
        return lost


PROBES: tuple[type[Probe], ...] = (RunQueueLatency, SyscallLatency, TcpEvents, BlockLatency,
                                   ProcessEvents)

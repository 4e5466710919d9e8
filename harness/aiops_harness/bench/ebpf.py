"""`aiops bench ebpf`: what the eBPF collector costs (root only).

1. Per-syscall cost with syscall tracing on vs off, on compiled loops (a Python loop would hide
   the cost behind the interpreter): `getppid`, the cheapest syscall there is (worst case), and
   `read` of 4 KiB and 64 KiB from /dev/zero (syscalls that do some work). Beside them, the
   floor: the same loops with empty programs on the same tracepoints, which is what the
   kernel's tracepoint path costs whatever the program does. Off, floor and on alternate,
   three rounds, medians reported.
2. CPU share of the collector (all probes) while the embedded stack serves a mixed workload:
   its own CPU seconds, as it reports them, over the wall time.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import AIOpsError
from aiops_harness.bench.common import free_port

__all__ = ["EbpfResult", "run_ebpf"]

_LOOP_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = atol(argv[2]);
    size_t size = argc > 3 ? (size_t)atol(argv[3]) : 4096;
    static char buf[1 << 16];
    int fd = open("/dev/zero", O_RDONLY);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (strcmp(argv[1], "getppid") == 0)
        for (long i = 0; i < n; i++) syscall(SYS_getppid);
    else
        for (long i = 0; i < n; i++) if (read(fd, buf, size) != (ssize_t)size) return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.2f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""


WORKLOADS = {"getppid": ("getppid", 0), "read 4 KiB": ("read", 4096),
             "read 64 KiB": ("read", 65536)}
_EMPTY = (b"RAW_TRACEPOINT_PROBE(sys_enter) { return 0; }\n"
          b"RAW_TRACEPOINT_PROBE(sys_exit) { return 0; }\n")


@dataclass
class SyscallCost:
    off_ns: float
    floor_ns: float  # empty programs attached
    on_ns: float

    @property
    def ratio(self) -> float:
        return self.on_ns / self.off_ns

    @property
    def floor_ratio(self) -> float:
        return self.floor_ns / self.off_ns


@dataclass
class EbpfResult:
    syscalls: dict[str, SyscallCost]
    collector_cpu_share: float  # of one core
    workload_s: float
    requests: int


def _ns_per_call(binary: Path, which: str, size: int, n: int) -> float:
    out = subprocess.run(["taskset", "-c", "1", str(binary), which, str(n), str(size)],
                         check=True, capture_output=True, text=True).stdout
    return float(out)


def _syscall_cost(workdir: Path, n: int, rounds: int) -> dict[str, SyscallCost]:
    from bcc import BPF

    from collectors.ebpf.collector import kernel_source
    from collectors.ebpf.probes import SyscallLatency

    src, binary = workdir / "loop.c", workdir / "loop"
    src.write_text(_LOOP_C)
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(src)], check=True)
    headers = kernel_source(None)
    if headers is not None:
        os.environ["BCC_KERNEL_SOURCE"] = str(headers)
    samples: dict[str, dict[str, list[float]]] = {
        w: {"off": [], "floor": [], "on": []} for w in WORKLOADS}

    def measure(state: str) -> None:
        for name, (which, size) in WORKLOADS.items():
            samples[name][state].append(_ns_per_call(binary, which, size, n))

    for _ in range(rounds):
        measure("off")
        empty = BPF(text=_EMPTY)
        try:
            measure("floor")
        finally:
            empty.cleanup()
        probe = SyscallLatency(8192)
        probe.load()
        try:
            measure("on")
        finally:
            probe.close()
    return {w: SyscallCost(*(statistics.median(s[k]) for k in ("off", "floor", "on")))
            for w, s in samples.items()}


def _drive(settings: Settings, seconds: float) -> int:
    """Chat and embedding requests from two clients for ``seconds``; returns how many."""
    from aiops_harness.demo import MODEL

    done = [0]
    deadline = time.monotonic() + seconds

    def client(kind: str) -> None:
        with httpx.Client(timeout=120) as c:
            while time.monotonic() < deadline:
                if kind == "chat":
                    c.post(f"{settings.serve_url}/v1/chat/completions", json={
                        "model": MODEL, "max_tokens": 16,
                        "messages": [{"role": "user", "content": "Name a colour."}]})
                else:
                    c.post(f"{settings.serve_url}/v1/embeddings", json={
                        "model": "minilm-l6-v2", "input": ["a short sentence"] * 8})
                done[0] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in ("chat", "embed")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


def _collector_share(workdir: Path, seconds: float) -> tuple[float, int]:
    from aiops import stack

    settings = Settings(data_dir=workdir / "stack", server_port=free_port(),
                        serve_port=free_port(), control_port=free_port(),
                        ray_metrics_port=free_port(), ebpf="on", log_level="WARNING")
    stack.up(settings)
    try:
        started_ns = time.time_ns()
        requests = _drive(settings, seconds)
        time.sleep(2 * settings.ebpf_interval_s + 1)  # the last drains land
        ended_ns = time.time_ns()
        with ServerClient.of(settings) as client:
            row = client.sql("SELECT sum(value) FROM metric_points WHERE name = "
                             "'aiops.ebpf.collector.cpu_seconds' AND epoch_ns(time) > ?",
                             [started_ns])["rows"][0]
    finally:
        stack.down(settings)
    if row[0] is None:
        raise AIOpsError("the collector reported no CPU time: did it start?")
    return float(row[0]) / ((ended_ns - started_ns) / 1e9), requests


def run_ebpf(syscalls: int = 2_000_000, rounds: int = 3, workload_s: float = 30.0
             ) -> EbpfResult:
    from collectors.ebpf.collector import preflight

    problems = preflight()
    if problems:
        raise AIOpsError("the eBPF benchmark needs the collector to run: " + "; ".join(problems))
    with tempfile.TemporaryDirectory(prefix="aiops-bench-ebpf-") as tmp:
        costs = _syscall_cost(Path(tmp), syscalls, rounds)
        share, requests = _collector_share(Path(tmp), workload_s)
    return EbpfResult(costs, share, workload_s, requests)

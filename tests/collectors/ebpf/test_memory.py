"""Replica resident memory from /proc: one gauge per listed replica, in bytes, with its
Serve identity; a replica gone since the list was written is skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

from collectors.ebpf.attribution import Processes
from collectors.ebpf.memory import RSS_METRIC, replica_rss


def _procs(tmp_path: Path, *pids: int) -> Processes:
    replicas = tmp_path / "serve-replicas.json"
    replicas.write_text(json.dumps([{"pid": pid, "replica": f"r{pid}", "model": "echo",
                                     "version": "v1"} for pid in pids]))
    procs = Processes(replicas)
    procs.refresh()
    return procs


def test_a_replicas_resident_memory_is_a_gauge_in_bytes(tmp_path: Path) -> None:
    grown = bytearray(64 * 2**20)
    grown[::4096] = b"\x01" * len(grown[::4096])  # touched: resident
    [m] = replica_rss(_procs(tmp_path, os.getpid()))
    assert m.name == RSS_METRIC and m.gauge and m.unit == "By"
    assert m.value is not None and m.value > 64 * 2**20
    assert m.attributes["gen_ai.request.model"] == "echo"
    assert m.attributes["ray.serve.replica"] == f"r{os.getpid()}"
    del grown


def test_a_replica_that_is_gone_is_skipped(tmp_path: Path) -> None:
    assert replica_rss(_procs(tmp_path, 2**22 + 4321)) == []


def test_a_replicas_cpu_time_is_counted_per_interval(tmp_path: Path) -> None:
    import time

    from collectors.ebpf.memory import CPU_METRIC, CpuTimes

    procs, cpu = _procs(tmp_path, os.getpid()), CpuTimes()
    assert cpu.collect(procs) == []  # a first reading has nothing to compare with
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    [m] = cpu.collect(procs)
    assert m.name == CPU_METRIC and not m.gauge and m.unit == "s"
    assert m.value is not None and 0.2 <= m.value <= 1.0

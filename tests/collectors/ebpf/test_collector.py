"""The collector on the real kernel (root only): what a workload does shows up for its pid."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.ebpf.collector import EbpfCollector
from collectors.ebpf.probes import ProcessEvents, SyscallLatency
from tests.conftest import RunningServer

pytestmark = pytest.mark.usefixtures("ebpf_allowed")


def _points(server: RunningServer, name: str, pid: int) -> list[tuple[int, float, float]]:
    """(count, sum, value) of the points of ``name`` attributed to ``pid``."""
    return [tuple(r) for r in server.store.query(
        "SELECT count, sum, value FROM metric_points WHERE name = ? "
        "AND (attributes->>'$.\"process.pid\"')::BIGINT = ?", [name, pid]).rows]


def test_a_syscall_heavy_process_shows_up_in_syscall_latency(server: RunningServer) -> None:
    collector = EbpfCollector(server.url, probes=(SyscallLatency,))
    try:
        assert not collector.stats.attach_failures
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import os\nfor _ in range(200_000): os.getppid()"])
        assert proc.wait(timeout=60) == 0
        child = proc.pid
        assert collector.cycle() > 0
    finally:
        collector.close()
    points = _points(server, "aiops.ebpf.syscall.latency", child)
    count = sum(p[0] for p in points)
    assert count >= 200_000, f"syscalls recorded for pid {child}: {count}"
    assert 0 < sum(p[1] for p in points) / count < 0.001  # a mean well under a millisecond
    drops = server.store.query("SELECT sum(value) FROM metric_points WHERE name = "
                               "'aiops.ebpf.collector.drops'").rows[0][0]
    assert drops == 0


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A memory-limited cgroup (v1 here; v2 where that is the hierarchy), where allowed."""
    name = f"aiops-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    try:
        if (v1 / "memory.limit_in_bytes").exists():
            group = v1 / name
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(64 * 2**20))
            swap = group / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(64 * 2**20))
        elif "memory" in (v2 / "cgroup.controllers").read_text():
            group = v2 / name
            group.mkdir()
            (group / "memory.max").write_text(str(64 * 2**20))
            (group / "memory.swap.max").write_text("0")
        else:
            pytest.skip("no memory controller in this cgroup hierarchy")
    except OSError as exc:
        pytest.skip(f"this kernel does not allow a memory-limited cgroup here: {exc}")
    yield group
    for _ in range(50):
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def test_an_oom_victim_is_recorded(server: RunningServer, memory_cgroup: Path) -> None:
    collector = EbpfCollector(server.url, probes=(ProcessEvents,))
    try:
        # The child moves itself into the cgroup, then touches 512 MiB against a 64 MiB limit.
        hog = ("import os, sys\n"
               f"open({str(memory_cgroup / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
               "b = bytearray(512 * 2**20)\n"
               "for i in range(0, len(b), 4096): b[i] = 1\n")
        proc = subprocess.Popen([sys.executable, "-c", hog])
        assert proc.wait(timeout=60) == -9, "the child should have been OOM-killed"
        time.sleep(0.2)
        collector.cycle()
    finally:
        collector.close()
    kills = _points(server, "aiops.ebpf.oom.kills", proc.pid)
    assert [k[2] for k in kills] == [1.0], f"oom kills recorded for pid {proc.pid}: {kills}"
    attrs = json.loads(server.store.query(
        "SELECT attributes FROM metric_points WHERE name = 'aiops.ebpf.oom.kills'").rows[0][0])
    assert attrs["process.command"].startswith("python")


def test_exits_carry_how_the_process_ended(server: RunningServer) -> None:
    """A replica stopped on purpose exits cleanly; a crash does not: the status tells."""
    collector = EbpfCollector(server.url, probes=(ProcessEvents,))
    try:
        clean = subprocess.Popen([sys.executable, "-c", "pass"])
        failed = subprocess.Popen([sys.executable, "-c", "import os; os._exit(3)"])
        killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(0.5)
        killed.kill()
        assert (clean.wait(30), failed.wait(30), killed.wait(30)) == (0, 3, -9)
        time.sleep(0.2)
        collector.cycle()
    finally:
        collector.close()
    statuses = {}
    for proc, want in ((clean, "clean"), (failed, "error:3"), (killed, "signal:9")):
        rows = server.store.query(
            "SELECT (attributes->>'process.exit.status') FROM metric_points WHERE name = "
            "'aiops.ebpf.process.exits' AND (attributes->>'$.\"process.pid\"')::BIGINT = ?",
            [proc.pid]).rows
        statuses[want] = [r[0] for r in rows]
    assert statuses == {"clean": ["clean"], "error:3": ["error:3"], "signal:9": ["signal:9"]}

"""The collector `aiops up` started, watching the real Serve replicas (root only)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.stack import read_state
from aiops_harness.demo import MODEL
from collectors.ebpf.attribution import REPLICAS_FILE

pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("ebpf_allowed")]

PHASE_S = 8.0


def _replica(settings: Settings, model: str, timeout_s: float = 60) -> dict[str, Any]:
    path = settings.data_dir / REPLICAS_FILE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            for row in json.loads(path.read_text()):
                if row["model"] == model:
                    return dict(row)
        time.sleep(0.5)
    raise AssertionError(f"no replica of {model} in {path}")


def _pin(pid: int, cpus: set[int]) -> None:
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just exited
            os.sched_setaffinity(int(task.name), cpus)


@pytest.fixture
def chat_load(stack: Settings) -> Iterator[None]:
    """Short chat requests at a gentle pace: the replica computes in bursts, and the rest of
    the stack (ingress, server) does not saturate the machine by itself."""
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                client.post(f"{stack.serve_url}/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Say hi."}]})
                stop.wait(0.5)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield
    stop.set()
    t.join(timeout=60)


def _runq(client: ServerClient, pid: int, start_ns: int, end_ns: int) -> tuple[float, float]:
    """Seconds spent runnable but waiting for a CPU per second, and the mean wait."""
    row = client.sql(
        "SELECT sum(sum), sum(count) FROM metric_points "
        "WHERE name = 'aiops.ebpf.runq.latency' AND (attributes->>'process.pid')::BIGINT = ? "
        "AND epoch_ns(time) BETWEEN ? AND ?", [pid, start_ns, end_ns])["rows"][0]
    assert row[1], f"no run-queue latency for pid {pid} in the window"
    return float(row[0]) / ((end_ns - start_ns) / 1e9), float(row[0]) / float(row[1])


def test_up_started_the_collector(stack: Settings) -> None:
    assert "ebpf" in {c.name for c in read_state(stack)}


@pytest.mark.usefixtures("chat_load")
def test_a_cpu_hog_on_the_replicas_core_raises_its_run_queue_latency(stack: Settings) -> None:
    """The replica (pinned to core 0) serves chat requests alone, then beside a busy loop
    pinned to the same core."""
    replica = _replica(stack, MODEL)
    pid = int(replica["pid"])
    _pin(pid, {0})
    try:
        alone = _with_hogs(core=0, n=0)
        beside_hog = _with_hogs(core=0, n=1)
    finally:
        _pin(pid, set(range(os.cpu_count() or 1)))
    time.sleep(3)  # one more drain and the server's commit
    with ServerClient(stack.server_url) as client:
        before = _runq(client, pid, *alone)
        during = _runq(client, pid, *beside_hog)
        assert during[0] > 2 * before[0], (
            f"run-queue wait {before[0] * 1e3:.0f} -> {during[0] * 1e3:.0f} ms/s "
            f"(mean {before[1] * 1e6:.0f} -> {during[1] * 1e6:.0f} us)")
        attrs = client.rows(
            "SELECT DISTINCT (attributes->>'ray.serve.deployment') AS deployment, "
            "(attributes->>'aiops.model.version') AS version, "
            "(attributes->>'ray.serve.replica') AS replica FROM metric_points "
            "WHERE name = 'aiops.ebpf.runq.latency' AND (attributes->>'process.pid')::BIGINT = ?",
            [pid])
    assert attrs == [{"deployment": replica["deployment"], "version": replica["version"],
                      "replica": replica["replica"]}]


def _with_hogs(core: int, n: int) -> tuple[int, int]:
    """Run n busy loops pinned to ``core`` for a phase; the window to read (ns), leaving out
    the collector's first interval (points carry the end of their interval)."""
    # A noisy neighbour other load on a busy machine cannot dilute: with autogroup scheduling
    # (each session a group, fair between groups, nice only inside one) the hog gets its own
    # session and that group's nice is -10, about 9x the weight of any other group.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]
    try:
        for h in hogs:
            os.sched_setaffinity(h.pid, {core})
            os.setpriority(os.PRIO_PROCESS, h.pid, -10)
            with contextlib.suppress(OSError):  # kernels without autogroup
                Path(f"/proc/{h.pid}/autogroup").write_text("-10")
        start = time.time_ns() + 2_100_000_000
        time.sleep(PHASE_S + 2)
        return start, time.time_ns()
    finally:
        for h in hogs:
            h.kill()
            h.wait()

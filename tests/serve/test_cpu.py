"""A replica in the idle CPU class: every thread it has, and every thread it starts after,
runs in SCHED_IDLE (checked in a child process, so the test runner keeps its own class)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import os, threading
from serve.cpu import use_idle_cpu
# Before: alive until the checks are done (a timed wait could end under load, and a thread
# gone between listing and asking would fail the check rather than the code).
done = threading.Event()
threading.Thread(target=done.wait, daemon=True).start()
moved = use_idle_cpu()
later = []
t = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))  # after
t.start(); t.join()
def policy(tid):
    try:
        return os.sched_getscheduler(tid)
    except ProcessLookupError:  # joined, yet still listed for a moment: Python's join returns
        return os.SCHED_IDLE    # before the OS thread is gone
policies = [policy(int(t)) for t in os.listdir("/proc/self/task")]
print(moved, all(p == os.SCHED_IDLE for p in policies), later == [os.SCHED_IDLE])
done.set()
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")
def test_every_thread_before_and_after_runs_in_the_idle_class() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    moved, all_idle, inherited = int(out[0]), out[1], out[2]
    assert moved >= 2 and all_idle == "True" and inherited == "True"

"""CPU per process role (aiops_harness.bench.cpu): the figures that say who used the cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from aiops_harness.bench.cpu import Role, cores_used, snapshot

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")


def test_a_busy_child_is_counted_under_its_role_and_an_idle_one_is_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                             "while time.time()-t<5: pass", "busy-marker"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)", "idle-marker"])
    roles = (Role("busy", lambda _, c: "busy-marker" in c),
             Role("idle", lambda _, c: "idle-marker" in c),
             Role("me", lambda pid, _: pid == os.getpid()))
    try:
        time.sleep(0.3)  # both started (interpreter start-up is CPU too)
        before = snapshot(roles)
        time.sleep(1.0)
        used = cores_used(before, snapshot(roles))
    finally:
        busy.kill(), idle.kill()
        busy.wait(), idle.wait()
    # Busy is what it got of a core: on a 2-core runner with the test lanes beside it, as
    # little as half (0.499 seen in CI); idle is next to nothing either way.
    assert used["busy"] > 0.25
    assert used.get("idle", 0.0) < 0.1 < used["busy"]
    assert "me" in used and "other" in used  # everything else is somebody's
    assert list(used.values()) == sorted(used.values(), reverse=True)


def test_no_wall_time_between_snapshots_gives_no_figures() -> None:
    s = snapshot(())
    assert cores_used(s, s) == {}

"""CPU scheduling class of a replica's process.

``resources.cpu_class: idle`` puts every thread of the replica (and, by inheritance, every
thread it starts later: the backend's workers, the event loop's executor) in Linux's
``SCHED_IDLE`` class: the kernel runs it only on CPU time no normal thread wants, so on a
machine short of cores it cannot slow the replicas that serve users (the agent's own LLM is
the case: docs/agent.md). It is weighted, not absolute: an idle-class thread still gets a
sliver under full load, so health checks keep answering.
"""

from __future__ import annotations

import logging
import os

__all__ = ["use_idle_cpu"]

log = logging.getLogger(__name__)


def use_idle_cpu() -> int:
    """Move this process's threads to SCHED_IDLE; returns how many were moved (0 where the
    platform has no such class)."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        log.warning("cpu_class idle: this platform has no SCHED_IDLE; running as normal")
        return 0
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
            moved += 1
        except (ProcessLookupError, PermissionError, OSError):
            continue  # a thread that ended meanwhile
    return moved

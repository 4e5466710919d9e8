"""Where a replica runs a backend call, by priority class.

The ingress's admission control decides who gets one of a model's slots; once admitted, a
realtime request still shares the replica, and the cores, with the batch requests admitted
before it. Measured on 2 cores (docs/benchmarks.md "Priority under load"): with the cores
full, a realtime embedding waited behind batch inferences for the CPU, not for a slot.

So a backend that runs calls concurrently (``concurrent_calls = True``: ONNX Runtime sessions
are safe to ``run`` from several threads) gets two lanes: realtime calls on the event loop's
default threads, as before, and batch calls on threads of their own whose Linux nice value is
raised (``BATCH_NICE``): the kernel gives them the cores' time that normal threads leave, so a
realtime inference starts and runs at once however much batch work is in the replica. Batch
work still gets every idle cycle, so its throughput falls only where realtime work takes the
cores. Raising one's own nice value needs no privilege, and a thread only ever lowers its own
priority, so nothing can be starved but batch work.

A backend that serialises its calls (one llama.cpp context) keeps a single lane: a batch call
at a low priority holding the backend's lock would make a realtime call wait for it at that
priority (priority inversion).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from serve.specs import Priority

__all__ = ["BATCH_NICE", "Lanes"]

log = logging.getLogger(__name__)

# The weight of a nice-10 thread is ~1/10 of a nice-0 one's (CFS): batch work keeps ~9% of a
# core that realtime work wants, and all of one it does not.
BATCH_NICE = 10

T = TypeVar("T")


def _lower_own_priority(nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError) as exc:  # not Linux, or a sandbox refusing it
        log.warning("batch calls run at normal CPU priority: %s", exc)


class Lanes:
    """``run(priority, fn, *args)``: ``fn(*args)`` on a thread of the priority's lane."""

    def __init__(self, concurrent: bool, batch_nice: int = BATCH_NICE) -> None:
        self._batch: ThreadPoolExecutor | None = None
        if concurrent:
            # As many threads as asyncio's default pool: the ingress's admission (the
            # replica's slots, ``qos.batch_max_in_flight``) bounds how many batch calls run.
            self._batch = ThreadPoolExecutor(
                thread_name_prefix="batch-lane", initializer=_lower_own_priority,
                initargs=(batch_nice,))

    async def run(self, priority: Priority, fn: Callable[..., T], *args: Any) -> T:
        if self._batch is not None and priority is Priority.BATCH:
            return await asyncio.get_running_loop().run_in_executor(self._batch, fn, *args)
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.shutdown(wait=False, cancel_futures=True)

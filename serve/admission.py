"""Admission control and priority queueing at the ingress, per model.

Up to ``capacity`` requests of a model are in flight at once (the spec's
``max_replicas * max_ongoing_requests``, so Serve still sees enough load to scale out). Beyond
that, requests wait in one bounded queue per priority class; a freed slot goes to the oldest
waiting ``realtime`` request before any ``batch`` one, and a class may have a cap of its own
(``max_in_flight``) that keeps slots free for the other. A request that finds its class's queue
full is refused at once with ``QueueFull`` (HTTP 429 with Retry-After). When a version stops
taking traffic (a rollback), its waiting requests are ``Rerouted``: they have not started, so
the ingress sends them to the version that now serves rather than through the one that broke.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from serve.specs import Priority

__all__ = ["AdmissionController", "QueueFull", "Rerouted"]

_ORDER = (Priority.REALTIME, Priority.BATCH)


class QueueFull(Exception):
    def __init__(self, priority: Priority, depth: int, retry_after_s: float) -> None:
        super().__init__(f"the {priority.value} queue is full ({depth} waiting); retry later")
        self.priority = priority
        self.retry_after_s = retry_after_s


class Rerouted(Exception):
    """The version this request waited for no longer takes traffic: pick another."""


class AdmissionController:
    """``max_in_flight``: a class's own cap on slots (the ``qos.batch_max_in_flight`` of a
    spec): the slots above it stay free for the other class, so a realtime request waits
    behind at most that many admitted batch requests in the replica, not ``capacity``."""

    def __init__(self, capacity: int, max_queue: dict[Priority, int],
                 retry_after_s: float = 1.0,
                 max_in_flight: dict[Priority, int] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.max_queue = dict(max_queue)
        self.max_in_flight = dict(max_in_flight or {})
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self._running: dict[Priority, int] = {p: 0 for p in _ORDER}
        self._waiting: dict[Priority, collections.deque[asyncio.Future[None]]] = {
            p: collections.deque() for p in _ORDER}

    def depth(self, priority: Priority) -> int:
        return sum(1 for f in self._waiting[priority] if not f.done())

    def _may_start(self, priority: Priority) -> bool:
        cap = self.max_in_flight.get(priority)
        return self.in_flight < self.capacity and (cap is None or self._running[priority] < cap)

    def _start(self, priority: Priority) -> None:
        self.in_flight += 1
        self._running[priority] += 1

    @asynccontextmanager
    async def slot(self, priority: Priority) -> AsyncIterator[None]:
        """Hold one in-flight slot for the duration of the ``async with`` block."""
        # Nobody jumps a waiting request that could take the slot (one held back only by
        # its class's own cap does not count).
        if self._may_start(priority) and not any(self.depth(p) and self._may_start(p)
                                                 for p in _ORDER):
            self._start(priority)
        else:
            depth = self.depth(priority)
            if depth >= self.max_queue.get(priority, 0):
                raise QueueFull(priority, depth, self.retry_after_s)
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[priority].append(granted)
            try:
                await granted  # the releaser started it: the slot is already counted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release(priority)  # granted just as we were cancelled: pass it on
                else:
                    granted.cancel()
                raise
        try:
            yield
        finally:
            self._release(priority)

    def reroute_waiting(self) -> int:
        """Release every waiting request with ``Rerouted`` (they hold no slot); how many."""
        n = 0
        for queue in self._waiting.values():
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_exception(Rerouted())
                    n += 1
        return n

    def _release(self, priority: Priority) -> None:
        self.in_flight -= 1
        self._running[priority] -= 1
        for p in _ORDER:  # the oldest waiter of the first class that may start
            queue = self._waiting[p]
            while queue and self._may_start(p):
                waiter = queue.popleft()
                if not waiter.done():
                    self._start(p)
                    waiter.set_result(None)
                    return

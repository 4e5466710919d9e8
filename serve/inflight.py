"""Requests a replica is serving now, reported before they end.

A span is exported when its request ends: a canary whose requests take 5 s more shows nothing
for 5 s. The replica keeps its open requests here and a gauge reports, at every metric export,
the ages of the ``TOP`` oldest per operation (``aiops.serve.in_flight.age``, seconds, one series
per rank, so a handful of series however busy the replica is), those open ``MIN_AGE_S`` or
more. The trace detector (aiops/analytics/traces.py) counts a request still open past its
baseline's slow level as a slow request, at least as slow as it is old.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aiops.semconv import IN_FLIGHT_AGE_METRIC as AGE_METRIC
from aiops.semconv import IN_FLIGHT_RANK_ATTR as RANK_ATTR

__all__ = ["AGE_METRIC", "MIN_AGE_S", "RANK_ATTR", "TOP", "InFlight"]

TOP = 4
# Younger requests are not news: a healthy replica's requests take milliseconds to seconds.
MIN_AGE_S = 1.0


class InFlight:
    """The open requests of one replica, by operation (``gen_ai.operation.name``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        """The block is one request of ``operation``, open until the block ends."""
        key = next(self._ids)
        with self._lock:
            self._open[key] = (operation, self._clock())
        try:
            yield
        finally:
            with self._lock:
                del self._open[key]

    def oldest(self, top: int = TOP, min_age_s: float = MIN_AGE_S
               ) -> list[tuple[str, int, float]]:
        """(operation, rank, age in seconds) of each operation's ``top`` oldest requests open
        ``min_age_s`` or more; rank 0 is the oldest."""
        now = self._clock()
        with self._lock:
            ages = sorted(((op, now - started) for op, started in self._open.values()),
                          key=lambda a: -a[1])
        out: list[tuple[str, int, float]] = []
        seen: dict[str, int] = {}
        for op, age in ages:
            rank = seen.get(op, 0)
            if age >= min_age_s and rank < top:
                out.append((op, rank, age))
                seen[op] = rank + 1
        return out

"""A watchdog for one untrusted query: interrupted at its deadline, or once the process has
grown by more than the query's memory budget.

DuckDB's ``memory_limit`` bounds its buffer pool, not the strings and lists a query builds
(``repeat``, ``string_agg``, ``list``): those come from its allocator directly. The process's
resident memory is what such a query costs, so it is sampled (every ``period_s``) against what
it was when the query began, less what DuckDB's buffer pool grew by meanwhile (cached blocks,
bounded by ``memory_limit``; another query's growth can still count against this one).
Between two samples the server's data-memory cap (``aiops.server.limits``) is the bound: an
allocation past it fails that query alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

__all__ = ["QueryWatch", "resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class QueryWatch:
    """``with QueryWatch(interrupt, timeout_s, max_growth): ...``; afterwards ``reason`` is
    ``"timeout"``, ``"memory"`` or ``""`` (it did not fire)."""

    def __init__(self, interrupt: Callable[[], None], timeout_s: float,
                 max_growth_bytes: int | None, period_s: float = 0.02,
                 pooled: Callable[[], int] | None = None) -> None:
        self.interrupt, self.timeout_s = interrupt, timeout_s
        self.max_growth, self.period_s = max_growth_bytes, period_s
        # What DuckDB's buffer pool holds (bounded by its memory_limit, shared by every
        # query): its growth is not this query's, and is taken off before judging.
        self.pooled = pooled
        self.reason = ""
        self.peak_growth = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="query-watch", daemon=True)

    def __enter__(self) -> QueryWatch:
        self._start = resident_bytes()
        self._pooled_start = self._pooled() if self.max_growth else 0
        self._deadline = time.monotonic() + self.timeout_s
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # Without a memory budget, one wait for the deadline; else a sample each period.
        period = self.period_s if self.max_growth else self.timeout_s
        while not self._stop.wait(min(period, max(0.0, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                self._fire("timeout")
                return
            if self.max_growth:
                growth = resident_bytes() - self._start
                if growth > self.max_growth and self.pooled is not None:
                    growth -= max(0, self._pooled() - self._pooled_start)
                self.peak_growth = max(self.peak_growth, growth)
                if growth > self.max_growth:
                    self._fire("memory")
                    return

    def _pooled(self) -> int:
        try:
            return self.pooled() if self.pooled is not None else 0
        except Exception:  # noqa: BLE001 - a failed reading must not end the watch
            return 0

    def _fire(self, reason: str) -> None:
        self.reason = reason
        self.interrupt()

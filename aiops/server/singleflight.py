"""One computation for every caller asking the same thing at once.

An expensive read that any viewer may ask for (a ledger verification reads every entry of a
table) must not run once per caller: 45 verifications at once took the server out of memory.
Callers of the same key while one runs wait for that one's answer, on the event loop (holding
no worker thread), each for at most its own deadline; the computation runs on one worker
thread and finishes even if its callers gave up, so the next caller may get it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from starlette.concurrency import run_in_threadpool

__all__ = ["SingleFlight"]


class SingleFlight:
    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, key: Hashable, fn: Callable[..., Any], *args: Any,
                  timeout_s: float | None = None) -> Any:
        """``fn(*args)``'s result, shared with every caller of ``key`` while it runs.
        TimeoutError after ``timeout_s`` (the computation goes on for the next caller)."""
        future = self._running.get(key)
        if future is None:
            future = asyncio.ensure_future(run_in_threadpool(fn, *args))
            self._running[key] = future
            future.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)

    def running(self) -> int:
        return len(self._running)

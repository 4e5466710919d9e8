"""A replica's lanes: batch calls of a backend that runs calls concurrently go to threads of
their own at a lower CPU priority, and a realtime call never waits for them."""

from __future__ import annotations

import asyncio
import os
import threading

from serve.lanes import BATCH_NICE, Lanes
from serve.specs import Priority


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_batch_calls_run_at_a_lower_cpu_priority_and_realtime_ones_do_not() -> None:
    lanes = Lanes(concurrent=True)
    base = os.getpriority(os.PRIO_PROCESS, 0)

    async def main() -> tuple[int, int]:
        return (await lanes.run(Priority.BATCH, _own_nice),
                await lanes.run(Priority.REALTIME, _own_nice))

    try:
        batch, realtime = asyncio.run(main())
    finally:
        lanes.close()
    assert batch == min(19, base + BATCH_NICE) and realtime == base


def test_a_realtime_call_finishes_while_a_batch_call_is_still_running() -> None:
    lanes = Lanes(concurrent=True)
    release = threading.Event()

    async def main() -> list[str]:
        done: list[str] = []

        async def call(priority: Priority, fn: object, name: str) -> None:
            await lanes.run(priority, fn)  # type: ignore[arg-type]
            done.append(name)

        batch = asyncio.create_task(call(Priority.BATCH, lambda: release.wait(10), "batch"))
        await asyncio.sleep(0.05)
        await call(Priority.REALTIME, lambda: None, "realtime")
        release.set()
        await batch
        return done

    try:
        assert asyncio.run(main()) == ["realtime", "batch"]
    finally:
        lanes.close()


def test_a_backend_that_serialises_its_calls_keeps_one_lane_at_normal_priority() -> None:
    # A low-priority batch call holding the backend's lock would hold realtime back with it.
    lanes = Lanes(concurrent=False)
    base = os.getpriority(os.PRIO_PROCESS, 0)

    async def main() -> int:
        return await lanes.run(Priority.BATCH, _own_nice)

    try:
        assert asyncio.run(main()) == base
    finally:
        lanes.close()

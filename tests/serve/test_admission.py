"""Admission control: bounded queues per class, realtime served before batch."""

from __future__ import annotations

import asyncio

import pytest

from serve.admission import AdmissionController, QueueFull
from serve.specs import Priority

RT, BATCH = Priority.REALTIME, Priority.BATCH


async def hold(gate: AdmissionController, p: Priority, release: asyncio.Event,
               order: list[str], tag: str) -> None:
    async with gate.slot(p):
        order.append(tag)
        await release.wait()


def test_requests_beyond_capacity_wait_and_realtime_goes_first() -> None:
    async def scenario() -> list[str]:
        gate = AdmissionController(capacity=1, max_queue={RT: 5, BATCH: 5})
        order: list[str] = []
        release = asyncio.Event()
        first = asyncio.create_task(hold(gate, BATCH, release, order, "b0"))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(hold(gate, p, release, order, t))
                   for p, t in [(BATCH, "b1"), (BATCH, "b2"), (RT, "r1")]]
        await asyncio.sleep(0.01)
        assert gate.depth(BATCH) == 2 and gate.depth(RT) == 1 and gate.in_flight == 1
        release.set()
        await asyncio.gather(first, *waiting)
        assert gate.in_flight == 0
        return order

    assert asyncio.run(scenario()) == ["b0", "r1", "b1", "b2"]


def test_a_full_class_queue_refuses_at_once_and_the_other_class_still_queues() -> None:
    async def scenario() -> None:
        gate = AdmissionController(capacity=1, max_queue={RT: 1, BATCH: 0}, retry_after_s=2)
        release = asyncio.Event()
        order: list[str] = []
        running = asyncio.create_task(hold(gate, RT, release, order, "r0"))
        await asyncio.sleep(0)
        queued = asyncio.create_task(hold(gate, RT, release, order, "r1"))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as info:
            async with gate.slot(RT):
                pass
        assert info.value.retry_after_s == 2 and "realtime queue is full" in str(info.value)
        with pytest.raises(QueueFull):
            async with gate.slot(BATCH):
                pass
        release.set()
        await asyncio.gather(running, queued)

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_up_its_place_without_leaking_a_slot() -> None:
    async def scenario() -> None:
        gate = AdmissionController(capacity=1, max_queue={RT: 2, BATCH: 2})
        release = asyncio.Event()
        order: list[str] = []
        running = asyncio.create_task(hold(gate, RT, release, order, "r0"))
        await asyncio.sleep(0)
        doomed = asyncio.create_task(hold(gate, RT, release, order, "gone"))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        assert gate.depth(RT) == 0
        release.set()
        await running
        assert gate.in_flight == 0 and order == ["r0"]
        async with gate.slot(BATCH):
            assert gate.in_flight == 1

    asyncio.run(scenario())


def test_a_batch_cap_keeps_slots_free_for_realtime() -> None:
    async def scenario() -> list[str]:
        gate = AdmissionController(capacity=3, max_queue={RT: 5, BATCH: 5},
                                   max_in_flight={BATCH: 1})
        order: list[str] = []
        release = asyncio.Event()
        batch = [asyncio.create_task(hold(gate, BATCH, release, order, f"b{i}"))
                 for i in range(3)]
        await asyncio.sleep(0.01)
        # One batch request runs; the others wait although two slots are free...
        assert order == ["b0"] and gate.in_flight == 1 and gate.depth(BATCH) == 2
        # ...and a realtime request takes one of them at once, ahead of waiting batch work.
        rt = asyncio.create_task(hold(gate, RT, release, order, "r0"))
        await asyncio.sleep(0.01)
        assert order == ["b0", "r0"] and gate.in_flight == 2
        release.set()
        await asyncio.gather(*batch, rt)
        assert gate.in_flight == 0 and gate.depth(BATCH) == 0
        return order

    assert asyncio.run(scenario()) == ["b0", "r0", "b1", "b2"]


def test_without_caps_a_freed_slot_is_handed_over_and_counted_once() -> None:
    async def scenario() -> None:
        gate = AdmissionController(capacity=2, max_queue={RT: 5, BATCH: 5})
        order: list[str] = []
        release = asyncio.Event()
        tasks = [asyncio.create_task(hold(gate, p, release, order, t))
                 for p, t in [(BATCH, "b0"), (BATCH, "b1"), (BATCH, "b2"), (RT, "r0")]]
        await asyncio.sleep(0.01)
        assert gate.in_flight == 2 and gate.depth(BATCH) == 1 and gate.depth(RT) == 1
        release.set()
        await asyncio.gather(*tasks)
        assert gate.in_flight == 0 and order == ["b0", "b1", "r0", "b2"]

    asyncio.run(scenario())

"""Traffic split between versions: weights, stickiness, and gates that survive rebuilds."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from serve.admission import Rerouted
from serve.routing import NoVersionServing, build_routes
from serve.specs import ModelSpec, Priority


def spec(version: str, **over: Any) -> dict[str, Any]:
    return ModelSpec.model_validate({"name": "m", "version": version, "backend": "echo",
                                     "model_type": "llm", **over}).model_dump(mode="json")


def table(weights: dict[str, int], **over: Any) -> dict[str, Any]:
    return {"models": {"m": [{"version": v, "app": f"m-{v}", "deployment": f"m-{v}",
                              "weight": w, "digest": "none", "spec": spec(v, **over)}
                             for v, w in weights.items()]}}


def handle(deployment: str, app: str) -> str:
    return f"handle:{app}/{deployment}"


def test_a_5_percent_canary_gets_about_5_percent() -> None:
    route = build_routes(table({"v1": 95, "v2": 5}), {}, handle)["m"]
    rng = random.Random(7)
    counts = Counter(route.pick(rng=rng).version for _ in range(20_000))
    assert 0.045 < counts["v2"] / 20_000 < 0.055


def test_a_sticky_session_always_lands_on_the_same_version() -> None:
    route = build_routes(table({"v1": 50, "v2": 50}), {}, handle)["m"]
    picks = {s: route.pick(sticky=s).version for s in (f"user-{i}" for i in range(200))}
    assert all(route.pick(sticky=s).version == v for s, v in picks.items())
    assert 60 < Counter(picks.values())["v2"] < 140  # and sessions still spread


def test_versions_at_zero_get_nothing_and_all_zero_is_refused() -> None:
    route = build_routes(table({"v1": 100, "v2": 0}), {}, handle)["m"]
    assert {route.pick().version for _ in range(200)} == {"v1"}
    assert route.primary.version == "v1"
    with pytest.raises(NoVersionServing, match="no version of model 'm'"):
        build_routes(table({"v1": 0}), {}, handle)["m"].pick()


def test_a_rebuild_keeps_gates_and_handles_and_takes_new_limits() -> None:
    first = build_routes(table({"v1": 100}), {}, handle)
    gate = first["m"].versions[0].gate
    gate.in_flight = 3  # requests in flight while the table changes
    second = build_routes(table({"v1": 90, "v2": 10}, max_ongoing_requests=7), first,
                          lambda d, a: pytest.fail("v1's handle must be reused")
                          if d == "m-v1" else handle(d, a))
    v1, v2 = second["m"].versions
    assert v1.gate is gate and gate.in_flight == 3 and gate.capacity == 7
    assert v1.handle == "handle:m-v1/m-v1" and v2.handle == "handle:m-v2/m-v2"


def test_a_rolled_back_version_hands_its_waiting_requests_back_to_be_routed_again() -> None:
    async def scenario() -> tuple[list[str], int]:
        first = build_routes(table({"v1": 70, "v2": 30}, max_ongoing_requests=1), {}, handle)
        gate = next(v.gate for v in first["m"].versions if v.version == "v2")
        release = asyncio.Event()

        async def request() -> str:
            try:
                async with gate.slot(Priority.REALTIME):
                    await release.wait()
                    return "served by v2"
            except Rerouted:
                return "rerouted"

        running = asyncio.create_task(request())
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(request()) for _ in range(2)]
        await asyncio.sleep(0)
        build_routes(table({"v1": 100, "v2": 0}, max_ongoing_requests=1), first, handle)
        outcomes = list(await asyncio.gather(*waiting))
        release.set()  # the request v2 had already started finishes there
        outcomes.append(await running)
        return outcomes, gate.in_flight

    outcomes, in_flight = asyncio.run(scenario())
    assert outcomes == ["rerouted", "rerouted", "served by v2"] and in_flight == 0

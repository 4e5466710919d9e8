"""The control plane's status is a typed contract: the Serve plane's status crosses the HTTP
API with the JSON clients have always read and comes back as the same typed value; an answer
that does not fit it is refused with a clear error, not a KeyError deep in the planner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aiops.attach.control import Planes, VllmControl
from aiops.config import AttachTarget
from aiops.control_status import ControlStatus, MalformedStatus, ModelStatus
from aiops.errors import AIOpsError
from aiops.lifecycle import LifecycleClient
from serve.control import ServeControl
from serve.control_api import create_control_app
from serve.specs import ModelSpec
from serve.telemetry import TelemetryConfig
from tests.loopback import serving

TOKEN = "t" * 32


def _spec(name: str, version: str, traffic: int | None = None, **over: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": name, "version": version, "backend": "echo",
                                     "model_type": "llm", "traffic": traffic, **over})


@pytest.fixture
def control(tmp_path: Path) -> ServeControl:
    c = ServeControl([_spec("chat", "v1", 100), _spec("chat", "v2", 0),
                      _spec("emb", "v1", autoscaling={"min_replicas": 1, "max_replicas": 3})],
                     TelemetryConfig("http://127.0.0.1:1"), {}, lambda _: None)
    c.deploy()
    c.set_faults("chat", "v2", {"latency_ms": 250, "crash_after": 3})
    c.shed("emb", ["batch"])
    return c


@pytest.fixture
def url(control: ServeControl) -> Iterator[str]:
    with serving(create_control_app(control, TOKEN)) as base:
        yield base


def _version(version: str, weight: int, deployment: str, faults: dict[str, Any],
             shed: list[str], hi: int = 1) -> dict[str, Any]:
    return {"version": version, "weight": weight, "backend": "echo", "deployment": deployment,
            "digest": None, "autoscaling": {"min_replicas": 1, "max_replicas": hi},
            "faults": faults, "shed": shed}


def test_the_serve_status_crosses_http_as_it_always_did_and_parses_back(
        control: ServeControl, url: str) -> None:
    got = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {TOKEN}"}).json()
    # The wire format, spelled out: every field the embedded plane sets, nulls included,
    # none of the attached planes' (target, kind, app, ...), an int fault still an int.
    assert got == {"models": {
        "chat": {"stable": "v1", "versions": [
            _version("v1", 100, "chat-v1", {}, []),
            _version("v2", 0, "chat-v2", {"latency_ms": 250.0, "crash_after": 3}, [])]},
        "emb": {"stable": "v1", "versions": [
            _version("v1", 100, "emb-v1", {}, ["batch"], hi=3)]}}}
    assert isinstance(got["models"]["chat"]["versions"][1]["faults"]["crash_after"], int)
    with LifecycleClient(url, TOKEN) as client:
        parsed = client.status()
        assert parsed == control.status() and parsed.wire() == got
        answer = client.canary("chat", "v2", 10)
    # An operation answers the model's status in the same shape.
    after = ModelStatus.parse(answer, "test")
    assert [(v.version, v.weight) for v in after.versions] == [("v1", 90), ("v2", 10)]
    assert after.wire() == answer


def _answering(body: bytes) -> LifecycleClient:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    return LifecycleClient("http://control.test", TOKEN, transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"models": {"chat": {"stable": "v1", "versions": [{"weight": 100}]}}}',
     r"models\.chat\.versions\.0\.version: Field required"),
    (b'{"models": {"chat": {"stable": null, "versions": [{"version": "v1", "weight": 150}]}}}',
     r"models\.chat\.versions\.0\.weight: Input should be less than or equal to 100"),
    (b'{"models": {"chat": {"stable": "v1", "versions": [], "owner": "x"}}}',
     r"models\.chat\.owner: Extra inputs are not permitted"),
    (b'{"chat": {}}', r"models: Field required"),
    (b"[]", r"\(top\): Input should be a valid dictionary"),
    (b"<html>", r"answered non-JSON"),
])
def test_a_malformed_status_is_refused_with_a_clear_error(body: bytes, problem: str) -> None:
    with _answering(body) as client, pytest.raises(MalformedStatus, match=problem) as err:
        client.status()
    assert isinstance(err.value, AIOpsError)
    assert "the control plane at http://control.test" in str(err.value)


def test_a_plane_answering_nonsense_is_left_out_of_the_merge() -> None:
    def broken() -> LifecycleClient:
        return _answering(b'{"models": {"chat": {"versions": "v1"}}}')

    target = AttachTarget(kind="vllm", name="a", url="http://127.0.0.1:1/a")
    with Planes([broken, lambda: VllmControl(target, lambda: ["embed"])]) as planes:
        assert set(planes.status().models) == {"embed"}
    with Planes([broken]) as planes, pytest.raises(MalformedStatus, match="stable"):
        planes.status()


def test_the_wire_keeps_exactly_the_fields_a_producer_set() -> None:
    sparse = {"models": {"m": {"stable": None, "versions": [{"version": "1", "weight": 100}]}}}
    status = ControlStatus.parse(sparse, "test")
    assert status.wire() == sparse
    v = status.models["m"].versions[0]
    # Unset fields read as "none" to consumers.
    assert (v.autoscaling, v.faults, v.shed, v.digest) == (None, {}, [], None)
    assert status.models["m"].version("1") is v and status.models["m"].version("2") is None

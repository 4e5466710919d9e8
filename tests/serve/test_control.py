"""The control plane: validated operations on the desired state, deployed declaratively.

The deployer is the one injected dependency (in production it drives Serve); here it records
the documents it is given, so the tests can check what would change and what would not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve.control import ControlError, NotFound, ServeControl
from serve.specs import ModelSpec
from serve.telemetry import TelemetryConfig


def spec(name: str, version: str, traffic: int | None = None, **over: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": name, "version": version, "backend": "echo",
                                     "model_type": "llm", "traffic": traffic, **over})


class Recorder:
    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def __call__(self, config: dict[str, Any]) -> None:
        self.configs.append(config)

    def app(self, name: str, n: int = -1) -> dict[str, Any]:
        return next(a for a in self.configs[n]["applications"] if a["name"] == name)

    def weights(self, n: int = -1) -> dict[str, int]:
        table = self.app("aiops", n)["deployments"][0]["user_config"]["models"]
        return {f"{m}:{v['version']}": v["weight"] for m, vs in table.items() for v in vs}


@pytest.fixture
def deployed(tmp_path: Path) -> tuple[ServeControl, Recorder]:
    rec = Recorder()
    control = ServeControl([spec("chat", "v1"), spec("emb", "v1")],
                           TelemetryConfig("http://127.0.0.1:1"), {}, rec,
                           state_file=tmp_path / "state.json")
    control.deploy()
    return control, rec


def test_apply_adds_a_version_at_zero_traffic_and_reports_the_change(
    deployed: tuple[ServeControl, Recorder],
) -> None:
    control, rec = deployed
    out = control.apply([spec("chat", "v1", 100), spec("chat", "v2", 0), spec("emb", "v1")])
    assert out == {"added": ["chat:v2"], "changed": ["chat:v1"], "removed": []}
    assert rec.weights() == {"chat:v1": 100, "chat:v2": 0, "emb:v1": 100}
    # Untouched versions get byte-identical build args: Serve leaves their replicas alone.
    assert rec.app("emb-v1", -1) == rec.app("emb-v1", 0)
    assert rec.app("chat-v1", -1)["args"] == rec.app("chat-v1", 0)["args"]


def test_canary_promote_and_rollback_move_only_weights(
    deployed: tuple[ServeControl, Recorder],
) -> None:
    control, rec = deployed
    control.apply([spec("chat", "v1", 100), spec("chat", "v2", 0), spec("emb", "v1")])
    args_before = rec.app("chat-v2")["args"]
    control.canary("chat", "v2", 5)
    assert rec.weights()["chat:v1"] == 95 and rec.weights()["chat:v2"] == 5
    assert control.rollback("chat") == "v1"
    assert rec.weights()["chat:v2"] == 0
    control.canary("chat", "v2", 50)
    control.promote("chat", "v2")
    assert rec.weights()["chat:v2"] == 100 and control.stable["chat"] == "v2"
    assert rec.app("chat-v2")["args"] == args_before  # no redeploy of the version itself
    assert control.rollback("chat") == "v2"


def test_refused_operations_change_nothing(deployed: tuple[ServeControl, Recorder]) -> None:
    control, rec = deployed
    n = len(rec.configs)
    with pytest.raises(NotFound, match="no version 'v9'"):
        control.canary("chat", "v9", 5)
    with pytest.raises(NotFound, match="'nope' does not exist"):
        control.promote("nope", "v1")
    with pytest.raises(ControlError, match="add up to 100"):
        control.set_traffic("chat", {"v1": 60})
    with pytest.raises(ControlError, match="no stable version of 'chat' other than 'v1'"):
        control.canary("chat", "v1", 5)
    with pytest.raises(ControlError, match="traffic weights add up to 150"):
        control.apply([spec("chat", "v1", 100), spec("chat", "v2", 50)])
    with pytest.raises(ControlError, match="invalid faults"):
        control.set_faults("chat", "v1", {"error_rate": 3})
    assert len(rec.configs) == n


def test_faults_travel_in_place(deployed: tuple[ServeControl, Recorder]) -> None:
    control, rec = deployed
    before = rec.app("chat-v1")
    control.set_faults("chat", "v1", {"latency_ms": 250, "error_rate": 0.1})
    after = rec.app("chat-v1")
    assert after["args"] == before["args"]
    assert after["deployments"][0]["user_config"]["faults"]["latency_ms"] == 250
    assert control.status().models["chat"].versions[0].faults == {
        "latency_ms": 250.0, "error_rate": 0.1}


def test_a_failed_deploy_keeps_the_previous_state(tmp_path: Path) -> None:
    def failing(config: dict[str, Any]) -> None:
        if any(a["name"] == "chat-v2" for a in config["applications"]):
            raise ControlError("chat-v2: replica failed to start")

    control = ServeControl([spec("chat", "v1")], TelemetryConfig("http://x"), {}, failing)
    control.deploy()
    with pytest.raises(ControlError, match="failed to start"):
        control.apply([spec("chat", "v1", 100), spec("chat", "v2", 0)])
    assert [s.version for s in control.specs] == ["v1"]

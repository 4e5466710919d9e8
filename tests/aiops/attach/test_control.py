"""One control plane over many: statuses merged, each action sent to the plane that serves
the model, a plane that is absent (no embedded stack) or down left out, and a vLLM server
refusing every change with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiops.attach.control import Planes, VllmControl, serve_status
from aiops.attach.history import ConfigHistory
from aiops.attach.ray_serve import AttachError, discover
from aiops.config import AttachTarget
from aiops.control_status import ReplicaBounds
from aiops.errors import StackError
from aiops.remediation.actions import NotSupported


def _vllm(name: str, models: list[str]) -> VllmControl:
    target = AttachTarget(kind="vllm", name=name, url=f"http://127.0.0.1:1/{name}")
    return VllmControl(target, lambda: models)


def _no_stack() -> VllmControl:
    raise StackError("no admin token: set AIOPS_ADMIN_TOKEN or start the stack")


def test_statuses_merge_and_an_absent_plane_is_left_out() -> None:
    with Planes([_no_stack, lambda: _vllm("a", ["chat"]), lambda: _vllm("b", ["embed"])]) as p:
        models = p.status().models
    assert set(models) == {"chat", "embed"}
    assert models["chat"].target == "a" and models["chat"].kind == "vllm"
    # On the wire, a vLLM model says no more than it knows.
    assert models["chat"].wire() == {"stable": None, "target": "a", "kind": "vllm",
                                     "versions": [{"version": "chat", "weight": 100}]}


def test_when_no_plane_answers_the_first_error_is_raised() -> None:
    with Planes([_no_stack]) as p, pytest.raises(StackError, match="no admin token"):
        p.status()


def test_actions_go_to_the_owner_and_vllm_refuses_with_the_reason() -> None:
    with Planes([lambda: _vllm("a", ["chat"])]) as p:
        with pytest.raises(NotSupported, match=r"cannot roll chat back: vLLM server a .*act "
                                               "where it is deployed"):
            p.rollback("chat")
        with pytest.raises(NotSupported, match="cannot scale chat"):
            p.scale("chat", "chat", 2, 2)
        with pytest.raises(AttachError, match="no control plane serves other"):
            p.rollback("other")


def test_every_deployment_of_a_composed_app_is_a_model_its_app_config_acts_for(
        tmp_path: Path) -> None:
    def app(version: str, scorer_replicas: int) -> dict[str, Any]:
        return {"status": "RUNNING", "deployed_app_config": {
            "name": "shop", "runtime_env": {"env_vars": {"OTEL_SERVICE_VERSION": version}},
            "deployments": [{"name": "Shop"}, {"name": "Scorer", "num_replicas":
                                               scorer_replicas}]},
            "deployments": {"Shop": {"target_num_replicas": 1, "replicas": []},
                            "Scorer": {"target_num_replicas": scorer_replicas,
                                       "replicas": []}},
            "deployment_topology": {"nodes": {"Shop": {"is_ingress": True}}}}

    history = ConfigHistory(tmp_path / "h.json", healthy_after_s=1)
    for t, v in ((0, "1"), (2, "1")):
        history.observe(discover({"applications": {"shop": app(v, 2)}}), set(), t * 10**9)
    apps = discover({"applications": {"shop": app("2", 2)}})
    models = serve_status(apps, history, "team-ray").models
    assert set(models) == {"shop", "shop.Scorer"}
    scorer = models["shop.Scorer"]
    # The Scorer's release 2 has a healthy predecessor: the planner can roll it back.
    assert scorer.stable == "1" and scorer.app == "shop"
    assert [(v.version, v.weight) for v in scorer.versions] == [("2", 100), ("1", 0)]
    assert scorer.versions[0].deployments == ["Scorer"]
    assert scorer.versions[0].autoscaling == ReplicaBounds(min_replicas=2, max_replicas=2)
    assert scorer.wire()["versions"] == [
        {"version": "2", "weight": 100, "app": "shop", "deployments": ["Scorer"],
         "autoscaling": {"min_replicas": 2, "max_replicas": 2}, "status": "RUNNING"},
        {"version": "1", "weight": 0, "app": "shop"}]

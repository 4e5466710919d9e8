"""One control plane over many: statuses merged, each action sent to the plane that serves
the model, a plane that is absent (no embedded stack) or down left out, and a vLLM server
refusing every change with the reason."""

from __future__ import annotations

import pytest

from aiops.attach.control import Planes, VllmControl
from aiops.attach.ray_serve import AttachError
from aiops.config import AttachTarget
from aiops.errors import StackError
from aiops.remediation.actions import NotSupported


def _vllm(name: str, models: list[str]) -> VllmControl:
    target = AttachTarget(kind="vllm", name=name, url=f"http://127.0.0.1:1/{name}")
    return VllmControl(target, lambda: models)


def _no_stack() -> VllmControl:
    raise StackError("no admin token: set AIOPS_ADMIN_TOKEN or start the stack")


def test_statuses_merge_and_an_absent_plane_is_left_out() -> None:
    with Planes([_no_stack, lambda: _vllm("a", ["chat"]), lambda: _vllm("b", ["embed"])]) as p:
        models = p.status()["models"]
    assert set(models) == {"chat", "embed"}
    assert models["chat"]["target"] == "a" and models["chat"]["kind"] == "vllm"


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

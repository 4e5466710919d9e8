"""The peers of ``aiops bench serve``: the same two-hop echo as aiops' ingress + model
replica, without aiops. (No ``from __future__ import annotations``, and classes at module
level: FastAPI must resolve ``Request`` in the Serve replica, which imports this module.)
"""

from typing import Any

from fastapi import FastAPI, Request
from ray import serve

__all__ = ["bare_app", "bare_fastapi_app"]


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class BareModel:
    def generate(self, text: str) -> str:
        return text


def _answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}]}


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class BareIngress:
    """Serve's plain HTTP entry point: ``__call__`` with a Starlette request."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return _answer(await self.model.generate.remote(body["messages"][-1]["content"]))


api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
@serve.ingress(api)
class BareFastApiIngress:
    """The same with a FastAPI ingress, to tell FastAPI's cost from aiops'."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return _answer(await self.model.generate.remote(body["messages"][-1]["content"]))


def bare_app(args: dict[str, Any] | None = None) -> Any:
    """Application builder (import path ``aiops.bench.peers:bare_app``)."""
    return BareIngress.bind(BareModel.bind())  # type: ignore[attr-defined]


def bare_fastapi_app(args: dict[str, Any] | None = None) -> Any:
    """Application builder (import path ``aiops.bench.peers:bare_fastapi_app``)."""
    return BareFastApiIngress.bind(BareModel.bind())  # type: ignore[attr-defined]

"""The peers of ``aiops bench serve``: the same two-hop echo as aiops' ingress + model
replica, without aiops. (No ``from __future__ import annotations``, and classes at module
level: FastAPI must resolve ``Request`` in the Serve replica, which imports this module.)
"""

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from ray import serve

__all__ = ["bare_app", "bare_fastapi_app", "fifo_chat_app", "fifo_embedding_app"]


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
    """Application builder (import path ``aiops_harness.bench.peers:bare_app``)."""
    return BareIngress.bind(BareModel.bind())  # type: ignore[attr-defined]


def bare_fastapi_app(args: dict[str, Any] | None = None) -> Any:
    """Application builder (import path ``aiops_harness.bench.peers:bare_fastapi_app``)."""
    return BareFastApiIngress.bind(BareModel.bind())  # type: ignore[attr-defined]


# -- the plain peer of ``aiops bench qos``: the embedding backend behind Serve's own FIFO ----


@serve.deployment
class FifoEmbedder:
    """The same backend object and call as aiops' ModelReplica.embed (a worker thread per
    request), without telemetry: requests beyond ``max_ongoing_requests`` wait in Serve's
    router, first come first served."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from serve.backends.base import get_backend
        from serve.specs import ModelSpec

        self.backend: Any = get_backend("onnx_embedding")(ModelSpec.model_validate(spec))
        self.backend.start()

    async def embed(self, texts: list[str]) -> dict[str, Any]:
        out = await asyncio.to_thread(self.backend.embed, texts)
        return {"vectors": out.vectors, "tokens": out.tokens}


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.1})
class FifoIngress:
    """Plain HTTP entry point taking the OpenAI embeddings body (``model``, ``input``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        raw = body["input"]
        texts = [raw] if isinstance(raw, str) else list(raw)
        out = await self.model.embed.remote(texts)
        return {"object": "list", "model": body.get("model", ""),
                "data": [{"object": "embedding", "index": i, "embedding": v}
                         for i, v in enumerate(out["vectors"])],
                "usage": {"prompt_tokens": out["tokens"], "total_tokens": out["tokens"]}}


def fifo_embedding_app(args: dict[str, Any]) -> Any:
    """Application builder (import path ``aiops_harness.bench.peers:fifo_embedding_app``): ``args``
    holds ``spec`` (a ModelSpec as JSON); the model deployment gets the spec's
    ``max_ongoing_requests``, replica count (``max_replicas``) and CPU/memory request."""
    spec = args["spec"]
    actor: dict[str, Any] = {"num_cpus": spec["resources"]["num_cpus"]}
    if spec["resources"].get("memory_mb"):
        actor["memory"] = spec["resources"]["memory_mb"] * 2**20
    model = FifoEmbedder.options(  # type: ignore[attr-defined]
        max_ongoing_requests=spec["max_ongoing_requests"],
        num_replicas=spec["autoscaling"]["max_replicas"],
        ray_actor_options=actor).bind(spec)
    return FifoIngress.bind(model)  # type: ignore[attr-defined]


# -- the plain peer of ``aiops bench qos --chat``: the chat backend behind Serve's FIFO ------


@serve.deployment
class FifoChat:
    """The chat backend (llama.cpp or vLLM) as ModelReplica.stream runs it (each token
    fetched on a worker thread), without telemetry or classes: every request is the same
    class (llama.cpp: one context; vLLM: one priority), first come first served."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from serve.backends.base import get_backend
        from serve.specs import ModelSpec

        model = ModelSpec.model_validate(spec)
        self.backend: Any = get_backend(model.backend)(model)
        self.backend.start()

    async def stream(self, body: dict[str, Any]) -> Any:
        from serve.backends.base import ChatMessage, GenerationRequest

        request = GenerationRequest(
            messages=tuple(ChatMessage(m["role"], m["content"]) for m in body["messages"]),
            max_tokens=int(body.get("max_tokens", 16)),
            temperature=float(body.get("temperature", 0.0)), realtime=False)
        chunks = self.backend.stream(request)
        try:
            while True:
                delta = await asyncio.to_thread(next, chunks, None)
                if delta is None:
                    break
                if delta.text:
                    yield delta.text
        finally:
            await asyncio.to_thread(chunks.close)


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.1})
class FifoChatIngress:
    """Plain HTTP entry point taking an OpenAI chat body and answering Server-Sent Events
    with OpenAI's chunk shape (``choices[0].delta.content``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def __call__(self, request: Request) -> Any:
        import json

        from starlette.responses import StreamingResponse

        body = await request.json()
        pieces = self.model.options(stream=True).stream.remote(body)

        async def events() -> Any:
            async for piece in pieces:
                chunk = {"object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"content": piece}}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def fifo_chat_app(args: dict[str, Any]) -> Any:
    """Application builder (import path ``aiops_harness.bench.peers:fifo_chat_app``): as
    ``fifo_embedding_app`` for a chat spec (its ``python`` too: a vLLM spec's replica runs in
    that interpreter)."""
    spec = args["spec"]
    actor: dict[str, Any] = {"num_cpus": spec["resources"]["num_cpus"]}
    if spec["resources"].get("memory_mb"):
        actor["memory"] = spec["resources"]["memory_mb"] * 2**20
    if spec.get("python"):
        actor["runtime_env"] = {"py_executable": str(spec["python"])}
    model = FifoChat.options(  # type: ignore[attr-defined]
        max_ongoing_requests=spec["max_ongoing_requests"],
        num_replicas=spec["autoscaling"]["max_replicas"],
        ray_actor_options=actor).bind(spec)
    return FifoChatIngress.bind(model)  # type: ignore[attr-defined]

"""The backend contract: plain classes that load a model and answer requests.

Backends know nothing of Ray or HTTP; ``serve.app`` wraps them in deployments. Every backend is
built from its ``ModelSpec`` and has ``start``/``shutdown``; what else it offers follows from
the spec's ``model_type`` (see ``ModelSpec.capabilities``), and each capability is one small
Protocol below. Backends register by name with ``register`` (the built-ins use the same hook a
third-party backend would) and are looked up lazily with ``get_backend``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = [
    "Backend",
    "ChatBackend",
    "ChatMessage",
    "Delta",
    "EmbeddingBackend",
    "Embeddings",
    "Generation",
    "GenerationRequest",
    "VisionBackend",
    "backend_names",
    "get_backend",
    "register",
]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    """A chat (``messages``) or a plain completion (``prompt``) request."""

    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    max_tokens: int = 128
    temperature: float = 0.7
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: str | None = None  # output must be JSON matching it ("{}": any JSON object)
    # The request's class at the ingress: an engine that schedules by priority (vLLM) puts
    # realtime requests first; the others ignore it.
    realtime: bool = True


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Delta:
    """One streamed piece. The last one has ``finish_reason`` and the token counts."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    tokens: int


class Backend(Protocol):
    def start(self) -> None: ...

    def shutdown(self) -> None: ...


class ChatBackend(Backend, Protocol):
    """Text generation: ``llm``, ``vlm`` and ``edge`` models."""

    def generate(self, request: GenerationRequest) -> Generation: ...

    def stream(self, request: GenerationRequest) -> Iterator[Delta]: ...


class EmbeddingBackend(Backend, Protocol):
    def embed(self, texts: list[str]) -> Embeddings: ...


class VisionBackend(Backend, Protocol):
    """Images in, text out (``vision`` and ``vlm`` models)."""

    def see(self, images: list[bytes], prompt: str) -> Generation: ...


B = TypeVar("B")
_REGISTRY: dict[str, Callable[[ModelSpec], Backend]] = {}
# Built-in backends, imported on first lookup so heavy engines load only where used.
_BUILTIN_MODULES = (
    "serve.backends.llamacpp",
    "serve.backends.onnx_embedding",
    "serve.backends.onnx_ocr",
    "serve.backends.echo",
    "serve.backends.vllm_engine",
)


def register(name: str) -> Callable[[B], B]:
    """Class decorator: make a backend available under ``name``."""

    def deco(cls: B) -> B:
        _REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def get_backend(name: str) -> Callable[[ModelSpec], Backend]:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no backend named {name!r}; known: {sorted(_REGISTRY)}") from None


def backend_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)

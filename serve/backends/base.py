"""The backend contract: a plain class that loads a model and answers requests.

Backends know nothing of Ray or HTTP; ``serve.app`` wraps them in deployments. They register by
name with ``register`` (built-ins use the same hook third-party backends would) and are looked
up with ``get_backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = [
    "ChatBackend",
    "ChatMessage",
    "ChatRequest",
    "ChatResult",
    "backend_names",
    "get_backend",
    "register",
]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    max_tokens: int = 128
    temperature: float = 0.7
    seed: int | None = None


@dataclass(frozen=True)
class ChatResult:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class ChatBackend(Protocol):
    """A chat model. ``start`` loads it, ``chat`` answers, ``shutdown`` frees it."""

    model_name: str

    def start(self) -> None: ...

    def chat(self, request: ChatRequest) -> ChatResult: ...

    def shutdown(self) -> None: ...


B = TypeVar("B")
_REGISTRY: dict[str, Callable[..., ChatBackend]] = {}


def register(name: str) -> Callable[[B], B]:
    """Class decorator: make a backend available under ``name``."""

    def deco(cls: B) -> B:
        _REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def get_backend(name: str) -> Callable[..., ChatBackend]:
    # Importing the built-ins here (not at module import) keeps heavy engines lazy.
    from serve.backends import llamacpp  # noqa: F401

    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no backend named {name!r}; known: {sorted(_REGISTRY)}") from None


def backend_names() -> list[str]:
    from serve.backends import llamacpp  # noqa: F401

    return sorted(_REGISTRY)

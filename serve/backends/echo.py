"""The echo backend: answers with the last user message, instantly.

A real backend with no model behind it, for measuring what the serving path itself costs
(``aiops bench serve``) and for tests that need a model that never varies. Options:
``delay_s`` (default 0) sleeps before answering, to stand in for model time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from serve.backends.base import Delta, Generation, GenerationRequest, register

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = ["EchoBackend"]


@register("echo")
class EchoBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.delay_s = float(spec.options.get("delay_s", 0.0))

    def start(self) -> None:
        pass

    def _words(self, request: GenerationRequest) -> tuple[list[str], int]:
        source = request.prompt if request.prompt is not None else (
            request.messages[-1].content if request.messages else "")
        words = source.split()
        return words[: request.max_tokens], len(source.split())

    def generate(self, request: GenerationRequest) -> Generation:
        if self.delay_s:
            time.sleep(self.delay_s)
        words, prompt = self._words(request)
        return Generation(" ".join(words), "stop", prompt, len(words))

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        words, prompt = self._words(request)
        for i, w in enumerate(words):
            if self.delay_s:
                time.sleep(self.delay_s / max(len(words), 1))
            yield Delta(w if i == 0 else f" {w}")
        yield Delta("", "stop", prompt, len(words))

    def shutdown(self) -> None:
        pass

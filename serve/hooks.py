"""Elastic-scaling hooks: what a replica does before it takes traffic and after it stops.

Pre-scale-out (``hooks.warmup``): the replica's constructor runs warm-up inferences straight on
its backend (weights paged in, buffers allocated, caches filled). Serve routes a replica no
traffic until its constructor returns, so a new replica's first routed request is not its
first inference. A warm-up that fails or outlasts its bound fails the constructor: Serve
marks the version DEPLOY_FAILED and the control plane's deploy fails with the reason. Warm-up
inferences are no served requests: no provenance entry, no request metrics; they leave one
span, ``warmup <model>`` with ``aiops.warmup = true`` (one event per inference), in a trace of
its own with no ingress span, and one log line.

Post-scale-in (``hooks.post_scale_in``): when Serve stops the replica (scale-in, redeploy,
shutdown; after its in-flight requests drained) it emits its archive record, the log event
``aiops.replica.retired`` (the server stores it in ``logs``): replica id, model@version,
artifact digest, hardware fingerprint, uptime, requests served and failed, its provenance
entries sealed in a digest, and the resources released (the spec's reservation and the
process's measured RSS); then it force-flushes its spans, logs and metrics within a bound.

The provenance digest is order-free, so it can be recomputed from the ``provenance`` table for
the replica's inference ids: the sum modulo 2**256 of sha256(``inference_id`` "\\n"
``input_hash``) over its entries, as ``sha256:`` and 64 hex digits.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import SpanKind, Status, StatusCode

from aiops.errors import ModelError
from aiops.schema import RETIRED_EVENT
from serve.backends.base import ChatMessage, GenerationRequest
from serve.specs import ModelSpec, WarmupRequest
from serve.telemetry import Telemetry, attrs

if TYPE_CHECKING:
    from serve.replica import ModelReplica

__all__ = [
    "RETIRED_EVENT",
    "WARMUP_ATTR",
    "ReplicaLedger",
    "WarmupFailed",
    "WarmupReport",
    "default_requests",
    "provenance_digest",
    "retire",
    "warm_up",
]

log = logging.getLogger(__name__)

WARMUP_ATTR = "aiops.warmup"
_MOD = 2**256


class WarmupFailed(ModelError):
    """A replica's warm-up failed; the replica does not start."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class WarmupReport:
    requests: int
    seconds: float
    durations_ms: tuple[float, ...]


def default_requests(spec: ModelSpec) -> list[WarmupRequest]:
    """The model type's default warm-up: one short request of the kind it serves."""
    from serve.gates import sample_image

    caps = spec.capabilities
    if "embeddings" in caps:
        return [WarmupRequest(text="warm-up")]
    if "chat" in caps:
        return [WarmupRequest(text="Say OK.", max_tokens=1)]
    return [WarmupRequest(image=base64.b64encode(sample_image()).decode())]


def _infer(replica: ModelReplica, request: WarmupRequest) -> None:
    """One warm-up inference straight on the backend (no span, metrics or provenance)."""
    backend: Any = replica.backend
    caps = replica.spec.capabilities
    if request.image is not None or not caps & {"chat", "embeddings"}:
        from serve.gates import sample_image

        image = (base64.b64decode(request.image) if request.image is not None
                 else sample_image())
        replica._check_output(backend.see([image], request.text or ""))
    elif "embeddings" in caps:
        backend.embed([request.text or ""])
    else:
        replica._check_output(backend.generate(GenerationRequest(
            messages=(ChatMessage("user", request.text or ""),),
            max_tokens=request.max_tokens, temperature=0.0, seed=0)))


def warm_up(replica: ModelReplica) -> WarmupReport | None:
    """Run the spec's warm-up (None when it has none); raise ``WarmupFailed`` naming the
    request that failed, or the bound it outlasted."""
    spec, warmup = replica.spec, replica.spec.hooks.warmup
    if warmup is None:
        return None
    plan = (warmup.requests or default_requests(spec)) * warmup.count
    who = f"{spec.name}:{spec.version}"
    span = replica.telemetry.tracer.start_span(
        f"warmup {spec.name}", kind=SpanKind.INTERNAL, attributes={
            WARMUP_ATTR: True, attrs.GEN_AI_OPERATION: "warmup",
            attrs.GEN_AI_SYSTEM: spec.backend, "aiops.warmup.planned": len(plan),
            **replica.labels})
    durations: list[float] = []
    abandoned = threading.Event()  # set on timeout: the worker stops at its next step

    def work() -> None:
        for i, request in enumerate(plan, 1):
            if abandoned.is_set():
                return
            t0 = time.perf_counter()
            try:
                _infer(replica, request)
            except Exception as exc:  # any failure refuses the replica
                raise WarmupFailed(f"{who}: warm-up request {i} of {len(plan)} failed: "
                                   f"{exc}") from exc
            ms = (time.perf_counter() - t0) * 1000
            if abandoned.is_set():
                return
            durations.append(ms)
            span.add_event("warmup.request", {"index": i, "duration_ms": ms})

    started = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aiops-warmup")
    try:
        pool.submit(work).result(timeout=warmup.timeout_s)
    except concurrent.futures.TimeoutError:
        abandoned.set()
        failure = WarmupFailed(f"{who}: warm-up did not finish within {warmup.timeout_s:g} s "
                               f"({len(durations)} of {len(plan)} requests done)",
                               timed_out=True)
    except WarmupFailed as exc:
        failure = exc
    else:
        seconds = time.perf_counter() - started
        span.set_attributes({"aiops.warmup.requests": len(durations),
                             "aiops.warmup.first_ms": durations[0],
                             "aiops.warmup.last_ms": durations[-1]})
        span.end()
        replica.telemetry.logger.info(
            "warm-up: %d requests in %.3f s (first %.0f ms, last %.0f ms)", len(durations),
            seconds, durations[0], durations[-1], extra={WARMUP_ATTR: True, **replica.labels})
        return WarmupReport(len(durations), seconds, tuple(durations))
    finally:
        pool.shutdown(wait=False)
    span.set_status(Status(StatusCode.ERROR, str(failure)))
    span.record_exception(failure)
    span.end()
    replica.telemetry.logger.error("%s", failure, extra={WARMUP_ATTR: True, **replica.labels})
    raise failure


def provenance_digest(entries: list[tuple[str, str]]) -> str:
    """The order-free digest of (inference_id, input_hash) entries (see the module doc)."""
    total = sum(_entry(i, h) for i, h in entries) % _MOD
    return f"sha256:{total:064x}"


def _entry(inference_id: str, input_hash: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{inference_id}\n{input_hash}".encode()).digest())


@dataclass
class ReplicaLedger:
    """What one replica did, for its archive record."""

    replica_id: str
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    served: int = 0
    failed: int = 0
    provenance_entries: int = 0
    _digest: int = 0
    warmup: WarmupReport | None = None

    def succeeded(self, inference_id: str, input_hash: str | None) -> None:
        """A served request; ``input_hash`` when its provenance entry was emitted."""
        self.served += 1
        if input_hash is not None:
            self.provenance_entries += 1
            self._digest = (self._digest + _entry(inference_id, input_hash)) % _MOD

    def record(self, spec: ModelSpec, hardware: str, digest: str) -> dict[str, Any]:
        """The archive record's attributes (plain values only: they travel as OTLP)."""
        rss, peak = _rss_mib()
        out: dict[str, Any] = {
            "replica": self.replica_id, "model": spec.name, "version": spec.version,
            "artifact_digest": digest, "hardware": hardware,
            "started_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "requests_served": self.served, "requests_failed": self.failed,
            "provenance_entries": self.provenance_entries,
            "provenance_digest": f"sha256:{self._digest:064x}",
            "released.num_cpus": spec.resources.num_cpus,
            "released.num_gpus": spec.resources.num_gpus,
            "released.rss_mb": rss, "released.peak_rss_mb": peak,
        }
        if spec.resources.memory_mb is not None:
            out["released.memory_mb"] = spec.resources.memory_mb
        if self.warmup is not None:
            out["warmup_requests"] = self.warmup.requests
            out["warmup_s"] = round(self.warmup.seconds, 3)
        return out


def _rss_mib() -> tuple[float, float]:
    """(resident, peak resident) MiB of this process, from /proc (nan where it is absent)."""
    found = {"VmRSS:": float("nan"), "VmHWM:": float("nan")}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key = line.split(" ", 1)[0].split("\t", 1)[0]
            if key in found:
                found[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return found["VmRSS:"], found["VmHWM:"]


def retire(replica: ModelReplica) -> dict[str, Any] | None:
    """Post-scale-in: emit the archive record (when asked), then flush (when asked). Returns
    the record's attributes, or None when archiving is off."""
    hook = replica.spec.hooks.post_scale_in
    record = None
    if hook.archive:
        record = replica.ledger.record(replica.spec, replica._hardware,
                                       replica.labels[attrs.ARTIFACT_DIGEST])
        body = (f"replica {record['replica']} of {record['model']}@{record['version']} "
                f"retired after {record['uptime_s']:.0f} s: {record['requests_served']} "
                f"requests served, {record['requests_failed']} failed; released "
                f"{record['released.num_cpus']:g} CPU, {record['released.rss_mb']} MiB RSS")
        replica.telemetry.logger_provider.get_logger("aiops.lifecycle").emit(
            event_name=RETIRED_EVENT, body=body, attributes=record,
            severity_number=SeverityNumber.INFO, severity_text="INFO")
        log.info("%s", body)
    if hook.flush:
        flush(replica.telemetry, hook.timeout_s)
    return record


def flush(telemetry: Telemetry, timeout_s: float) -> bool:
    """Force-flush logs, spans and metrics, all three within ``timeout_s``; True if all did."""
    deadline = time.monotonic() + timeout_s
    ok = True
    for provider in (telemetry.logger_provider, telemetry.tracer_provider,
                     telemetry.meter_provider):
        left_ms = max(int((deadline - time.monotonic()) * 1000), 50)
        ok = bool(provider.force_flush(left_ms)) and ok
    return ok

"""One model replica: a backend plus its instrumentation, independent of Ray.

``serve.app`` turns ``ModelReplica`` into a Serve deployment; tests can run it directly. Every
call continues the caller's trace (a W3C carrier dict), runs the backend off the event loop,
and records a GenAI span, a log record with the inference id, and metrics whose exemplars
point back at the trace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import asdict
from typing import Any, Protocol, runtime_checkable

import jsonschema
from opentelemetry import context as otel_context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, use_span

from aiops.errors import ModelError
from aiops.ledger import PROVENANCE_EVENT, canonical
from aiops.semconv import CONFIG_DIGEST_ATTR
from serve.backends.base import (
    Backend,
    ChatBackend,
    ChatMessage,
    Delta,
    EmbeddingBackend,
    Generation,
    GenerationRequest,
    VisionBackend,
    get_backend,
)
from serve.cpu import use_idle_cpu
from serve.faults import FaultInjector
from serve.gates import Trust, sample_image
from serve.hardware import fingerprint
from serve.hooks import ReplicaLedger, WarmupFailed, retire, warm_up
from serve.inflight import AGE_METRIC, RANK_ATTR, InFlight
from serve.keys import KeyUnavailable, key_provider_from_env
from serve.lanes import Lanes
from serve.packages import (
    ENCRYPTING_BACKENDS,
    PackageError,
    check_key,
    decrypt_artifact,
    encryption_of,
    load_public_keys,
    verify_package,
)
from serve.specs import Artifact, Faults, ModelSpec, Priority
from serve.telemetry import (
    DURATION_BUCKETS_S,
    TOKEN_BUCKETS,
    TPOT_BUCKETS_S,
    TTFT_BUCKETS_S,
    Telemetry,
    TelemetryConfig,
    attrs,
    extract_context,
)

__all__ = ["ModelReplica", "ReportsCacheUsage", "ReportsEngineMetrics", "start_backend"]

_DONE = object()


@runtime_checkable
class ReportsCacheUsage(Protocol):
    """A backend that can say how full its KV cache / context is (0..1)."""

    def cache_usage(self) -> float: ...


@runtime_checkable
class ReportsEngineMetrics(Protocol):
    """A backend whose engine keeps its own metrics (vLLM): exported as gauges."""

    def engine_metrics(self) -> list[tuple[str, float]]: ...


class ModelReplica:
    def __init__(self, spec: ModelSpec, telemetry: TelemetryConfig,
                 resource: Mapping[str, str] | None = None, trust: Trust | None = None) -> None:
        self.spec = spec
        _check_trust(spec, trust or Trust())
        res = {attrs.SERVICE_NAME: spec.name, attrs.SERVICE_VERSION: spec.version,
               **(resource or {})}
        if spec.artifact is not None:
            res[attrs.ARTIFACT_DIGEST] = spec.artifact.digest()
        self.telemetry = Telemetry(telemetry, res, component="model")
        digest = spec.artifact.digest() if spec.artifact is not None else "none"
        # Name, version and artifact digest go on every span, log record and metric point.
        self.labels = {attrs.GEN_AI_REQUEST_MODEL: spec.name, attrs.MODEL_VERSION: spec.version,
                       attrs.ARTIFACT_DIGEST: digest}
        self.faults = FaultInjector(spec.faults)
        # What Serve's user_config carries (serve.app), until reconfigure says otherwise.
        self.config_digest = config_digest({"faults": spec.faults.model_dump()})
        self._provenance = (self.telemetry.logger_provider.get_logger("aiops.provenance")
                            if telemetry.provenance else None)
        self._hardware = fingerprint()
        # What this replica did, for its archive record when it stops (serve.hooks).
        self.ledger = ReplicaLedger(res.get(attrs.SERVICE_INSTANCE_ID, "local"))
        meter = self.telemetry.meter
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s",
            description="Time the model replica spent on a request",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Input and output tokens per request",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s",
            description="Time from request start to the first streamed token",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS_S)
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Mean time between streamed tokens after the first",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS_S)
        self.requests = meter.create_counter(
            "aiops.model.requests", unit="{request}", description="Requests by outcome")
        self.cache_gauge = meter.create_gauge(
            "aiops.model.kv_cache.usage", unit="1",
            description="Share of the backend's KV cache / context in use after a request")
        self.in_flight = InFlight()
        meter.create_observable_gauge(
            AGE_METRIC, callbacks=[self._observe_in_flight], unit="s",
            description="Age of the oldest requests still being served, per operation "
                        "(one series per rank, the oldest first)")
        if spec.resources.cpu_class == "idle":
            # Before the backend starts its threads, so they inherit the class too.
            use_idle_cpu()
        self.backend = start_backend(spec)
        # Batch calls on low-priority threads of their own where the backend allows
        # concurrent calls (serve.lanes).
        self.lanes = Lanes(bool(getattr(self.backend, "concurrent_calls", False)))
        self._closed = False  # close() has something to close from here on
        if isinstance(self.backend, ReportsEngineMetrics):
            from serve.backends.vllm_engine import ENGINE_METRICS

            for name in ENGINE_METRICS.values():
                meter.create_observable_gauge(
                    name, callbacks=[self._engine_observer(name)],
                    description="The engine's own metric (counters are cumulative)")
        self._output = (jsonschema.Draft202012Validator(spec.output_schema)
                        if spec.output_schema else None)
        # Pre-scale-out, last: Serve routes nothing here until the constructor returns.
        try:
            self.ledger.warmup = warm_up(self)
        except WarmupFailed as exc:
            self._closed = True
            self.telemetry.shutdown()  # the failed warm-up's span and log reach the store
            if not exc.timed_out:  # a timed-out warm-up may still be inside the backend
                self.backend.shutdown()
            raise

    async def self_test(self) -> dict[str, Any]:
        """The run-time validation gate (see ``serve.gates``): a sample inference and, when
        the version's package carries reference outputs, numeric consistency with them."""
        from serve.gates import compare_reference, reference_kind, reference_outputs

        kind = reference_kind(self.spec)
        sample = {"embedding": ["gate check"], "text": ["Say OK."],
                  "vision": [base64.b64encode(sample_image()).decode()]}[kind]
        started = time.perf_counter()
        try:
            await asyncio.to_thread(reference_outputs, self.backend, kind, sample, 8)
        except Exception as exc:  # noqa: BLE001 - any failure is the gate's verdict
            return {"ok": False, "reason": f"sample inference failed: {exc}"}
        latency_ms = (time.perf_counter() - started) * 1000
        if latency_ms > self.spec.qos.timeout_s * 1000:
            return {"ok": False, "reason": f"sample inference took {latency_ms:.0f} ms, over "
                    f"the {self.spec.qos.timeout_s:g} s timeout"}
        reference = self._reference()
        if reference is None:
            return {"ok": True, "latency_ms": latency_ms, "reference": "none"}
        try:
            got = await asyncio.to_thread(
                reference_outputs, self.backend, reference["kind"], reference["inputs"],
                int(reference.get("max_tokens", 16)))
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "reason": f"reference inference failed: {exc}"}
        problem = compare_reference(reference["kind"], reference["outputs"], got,
                                    float(reference.get("tolerance", 1e-4)))
        if problem is not None:
            return {"ok": False, "reason": f"numeric check failed: {problem}"}
        return {"ok": True, "latency_ms": latency_ms, "reference": len(got)}

    def _reference(self) -> dict[str, Any] | None:
        bundle = self.spec.artifact.bundle if self.spec.artifact is not None else None
        if bundle is None or not (bundle / "reference.json").is_file():
            return None
        loaded: dict[str, Any] = json.loads((bundle / "reference.json").read_text())
        return loaded

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's in-place update (the deployment's user_config): faults change live. Each
        span carries the config's digest: a change in place is a release analytics can tie
        a regression to, though the version stays."""
        self.faults.update(Faults.model_validate(config.get("faults", {})))
        self.config_digest = config_digest(config)

    # -- helpers ---------------------------------------------------------------------------

    def _engine_observer(self, name: str) -> Any:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            backend: ReportsEngineMetrics = self.backend  # type: ignore[assignment]
            for metric, value in backend.engine_metrics():
                if metric == name:
                    yield Observation(value, self.labels)

        return observe

    def _observe_in_flight(self, _: CallbackOptions) -> Iterator[Observation]:
        for op, rank, age in self.in_flight.oldest():
            yield Observation(age, {**self.labels, attrs.GEN_AI_OPERATION: op, RANK_ATTR: rank})

    def _span(self, operation: str, carrier: Mapping[str, str], inference_id: str,
              extra: Mapping[str, Any] | None = None) -> Span:
        return self.telemetry.tracer.start_span(
            f"{operation} {self.spec.name}", context=extract_context(carrier),
            kind=SpanKind.INTERNAL,
            attributes={attrs.GEN_AI_OPERATION: operation, attrs.GEN_AI_SYSTEM: self.spec.backend,
                        attrs.INFERENCE_ID: inference_id, CONFIG_DIGEST_ATTR: self.config_digest,
                        **self.labels, **(extra or {})})

    def _fail(self, span: Span, exc: Exception, inference_id: str) -> None:
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        span.record_exception(exc)
        self.requests.add(1, {**self.labels, "outcome": "error"})
        self.ledger.failed += 1
        self.telemetry.logger.error("inference failed: %s", exc,
                                    extra={attrs.INFERENCE_ID: inference_id, **self.labels})

    def _record_provenance(self, inference_id: str, input_hash: str) -> None:
        if self._provenance is None:
            return
        # Emitted while the span is current: the record carries its trace and span ids.
        self._provenance.emit(event_name=PROVENANCE_EVENT, context=otel_context.get_current(),
                              attributes={
                                  "model": self.spec.name, "version": self.spec.version,
                                  "artifact_digest": self.labels[attrs.ARTIFACT_DIGEST],
                                  "input_hash": input_hash, "hardware": self._hardware,
                                  "inference_id": inference_id})

    def _succeed(self, span: Span, result: Generation, elapsed: float, inference_id: str,
                 input_hash: str) -> None:
        span.set_attributes({
            attrs.GEN_AI_RESPONSE_MODEL: self.spec.name,
            attrs.GEN_AI_INPUT_TOKENS: result.prompt_tokens,
            attrs.GEN_AI_OUTPUT_TOKENS: result.completion_tokens,
            attrs.GEN_AI_FINISH_REASONS: [result.finish_reason],
        })
        # Recorded while the span is current, so histogram exemplars carry this trace id.
        self.duration.record(elapsed, self.labels)
        self.tokens.record(result.prompt_tokens, {**self.labels, attrs.GEN_AI_TOKEN_TYPE: "input"})
        self.tokens.record(result.completion_tokens,
                           {**self.labels, attrs.GEN_AI_TOKEN_TYPE: "output"})
        self.requests.add(1, {**self.labels, "outcome": "ok"})
        if isinstance(self.backend, ReportsCacheUsage):
            self.cache_gauge.set(self.backend.cache_usage(), self.labels)
        self._record_provenance(inference_id, input_hash)
        self.ledger.succeeded(inference_id,
                               input_hash if self._provenance is not None else None)
        self.telemetry.logger.info(
            "%s in %.3f s: %d input tokens, %d output tokens, %s", self.spec.model_type.value,
            elapsed, result.prompt_tokens, result.completion_tokens, result.finish_reason,
            extra={attrs.INFERENCE_ID: inference_id, **self.labels})

    def _check_output(self, result: Generation) -> None:
        if self._output is not None:
            errors = sorted(self._output.iter_errors(asdict(result)), key=str)
            if errors:
                raise ModelError(f"output violates the model's output_schema: {errors[0].message}")

    async def _run(self, operation: str, carrier: Mapping[str, str], inference_id: str,
                   input_hash: str, priority: str, fn: Any, *args: Any) -> Generation:
        span = self._span(operation, carrier, inference_id)
        with use_span(span, end_on_exit=True), self.in_flight.track(operation):
            started = time.perf_counter()
            try:
                await self.faults.before_request()
                result: Generation = await self.lanes.run(Priority(priority), fn, *args)
                self._check_output(result)
            except ModelError as exc:
                self._fail(span, exc, inference_id)
                raise
            self._succeed(span, result, time.perf_counter() - started, inference_id, input_hash)
        return result

    # -- the deployment's methods ----------------------------------------------------------

    async def generate(self, payload: dict[str, Any], carrier: dict[str, str],
                       inference_id: str, priority: str = "realtime") -> dict[str, Any]:
        backend: ChatBackend = self.backend  # type: ignore[assignment]
        request = _generation_request(payload, priority)
        op = "text_completion" if request.prompt is not None else "chat"
        return asdict(await self._run(op, carrier, inference_id, input_digest(payload),
                                      priority, backend.generate, request))

    async def stream(self, payload: dict[str, Any], carrier: dict[str, str],
                     inference_id: str, priority: str = "realtime"
                     ) -> AsyncIterator[dict[str, Any]]:
        backend: ChatBackend = self.backend  # type: ignore[assignment]
        request = _generation_request(payload, priority)
        op = "text_completion" if request.prompt is not None else "chat"
        span = self._span(op, carrier, inference_id, {"gen_ai.request.stream": True})
        chunks: Iterator[Delta] = backend.stream(request)
        started = time.perf_counter()
        first: float | None = None
        try:
            with use_span(span, end_on_exit=True), self.in_flight.track(op):
                try:
                    await self.faults.before_request()
                    while True:
                        # Each token on the class's lane: a batch stream's tokens on the
                        # low-priority threads where the backend has them (serve.lanes).
                        delta = await self.lanes.run(Priority(priority), next, chunks, _DONE)
                        if delta is _DONE:
                            break
                        assert isinstance(delta, Delta)
                        await self.faults.per_token()
                        if first is None and delta.text:
                            first = time.perf_counter()
                            self.ttft.record(first - started, self.labels)
                        if delta.finish_reason is not None:
                            end = time.perf_counter()
                            if first is not None and delta.completion_tokens > 1:
                                self.tpot.record((end - first) / (delta.completion_tokens - 1),
                                                 self.labels)
                            self._succeed(span, Generation(
                                "", delta.finish_reason, delta.prompt_tokens,
                                delta.completion_tokens), end - started, inference_id,
                                input_digest(payload))
                        yield asdict(delta)
                except ModelError as exc:
                    self._fail(span, exc, inference_id)
                    raise
        finally:
            # A client that goes away closes us early: release the backend's context now.
            close = getattr(chunks, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    async def embed(self, texts: list[str], carrier: dict[str, str],
                    inference_id: str, priority: str = "realtime") -> dict[str, Any]:
        backend: EmbeddingBackend = self.backend  # type: ignore[assignment]
        span = self._span("embeddings", carrier, inference_id)
        with use_span(span, end_on_exit=True), self.in_flight.track("embeddings"):
            started = time.perf_counter()
            try:
                await self.faults.before_request()
                out = await self.lanes.run(Priority(priority), backend.embed, texts)
            except ModelError as exc:
                self._fail(span, exc, inference_id)
                raise
            self._succeed(span, Generation("", "stop", out.tokens, 0),
                          time.perf_counter() - started, inference_id, input_digest(texts))
        return {"vectors": out.vectors, "tokens": out.tokens}

    async def see(self, images: list[bytes], prompt: str, carrier: dict[str, str],
                  inference_id: str, priority: str = "realtime") -> dict[str, Any]:
        backend: VisionBackend = self.backend  # type: ignore[assignment]
        digest = input_digest({"prompt": prompt,
                               "images": [hashlib.sha256(i).hexdigest() for i in images]})
        return asdict(await self._run("vision", carrier, inference_id, digest, priority,
                                      backend.see, images, prompt))

    def close(self) -> None:
        """Post-scale-in (``serve.hooks.retire``), then telemetry and the backend; once."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        retire(self)
        self.telemetry.shutdown()
        self.lanes.close()
        self.backend.shutdown()


def _generation_request(payload: dict[str, Any], priority: str) -> GenerationRequest:
    return GenerationRequest(
        messages=tuple(ChatMessage(m["role"], m["content"]) for m in payload.get("messages", ())),
        prompt=payload.get("prompt"), max_tokens=payload["max_tokens"],
        temperature=payload["temperature"], seed=payload.get("seed"),
        stop=tuple(payload.get("stop", ())), json_schema=payload.get("json_schema"),
        realtime=Priority(priority) is Priority.REALTIME)


def _check_trust(spec: ModelSpec, trust: Trust) -> None:
    """Defence in depth: a replica refuses to load what the control plane should have refused."""
    bundle = spec.artifact.bundle if spec.artifact is not None else None
    if bundle is None:
        if trust.strict:
            raise ModelError(f"{spec.name}:{spec.version}: strict mode serves only signed "
                             "packages")
        return
    keys = load_public_keys(list(trust.keys))
    try:
        if trust.strict or keys:
            verify_package(bundle, keys)
        # A missing or wrong key is refused here, before telemetry or the backend start.
        if encryption_of(bundle) is not None:
            check_key(bundle, key_provider_from_env())
    except (PackageError, KeyUnavailable) as exc:
        raise ModelError(f"{spec.name}:{spec.version}: package refused: {exc}") from exc


def start_backend(spec: ModelSpec) -> Backend:
    """The spec's backend, started. An encrypted package is decrypted into memory first (key
    from ``serve.keys.key_provider_from_env``); the backend loads from there, and the memory
    files are released once it has read or mapped the weights."""
    bundle = spec.artifact.bundle if spec.artifact is not None else None
    try:
        encrypted = bundle is not None and encryption_of(bundle) is not None
        if not encrypted or bundle is None:
            backend = get_backend(spec.backend)(spec)
            backend.start()
            return backend
        if spec.backend not in ENCRYPTING_BACKENDS:
            raise PackageError(f"backend {spec.backend!r} cannot serve encrypted weights")
        plain = decrypt_artifact(bundle, key_provider_from_env())
    except (PackageError, KeyUnavailable) as exc:
        raise ModelError(f"{spec.name}:{spec.version}: package refused: {exc}") from exc
    with plain:
        backend = get_backend(spec.backend)(
            spec.model_copy(update={"artifact": Artifact(path=plain.path)}))
        backend.start()
    return backend


def config_digest(config: dict[str, Any]) -> str:
    """8 hex digits of the SHA-256 of a replica's in-place config, keys sorted."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()
                          ).hexdigest()[:8]


def input_digest(value: Any) -> str:
    """sha256 of a request's input in canonical JSON: equal inputs, equal digests."""
    return "sha256:" + hashlib.sha256(canonical(value).encode()).hexdigest()

"""The OpenAI-compatible HTTP front door of the Serve application.

Per request: optional API key, size limit, JSON + pydantic validation, model lookup and
capability check, the model's own ``input_schema``, admission control (429 when the priority
class's queue is full), a deadline (504), then the model deployment. Every response, error or
not, carries ``traceparent`` (this SERVER span) and ``x-inference-id``; errors use OpenAI's
error shape. (No ``from __future__ import annotations`` here: FastAPI must see real types
through Serve's ingress wrapper.)
"""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import jsonschema
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, use_span
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from serve.admission import AdmissionController, QueueFull
from serve.auth import authorized
from serve.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ImageError,
    chat_chunk,
    chat_completion_body,
    completion_body,
    completion_chunk,
    decode_data_url,
    embeddings_body,
    error_body,
    sse,
    validation_message,
)
from serve.options import ServeOptions
from serve.specs import ModelSpec, Priority
from serve.telemetry import Telemetry, attrs, extract_context, inject_context

__all__ = ["INGRESS_NAME", "Ingress", "api"]

log = logging.getLogger(__name__)

INGRESS_NAME = "ingress"
PRIORITY_HEADER = "x-aiops-priority"
M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """Raised inside a handler; becomes an OpenAI-style error response at the boundary."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type_, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.type, self.param, self.code),
                            status_code=self.status, headers=self.headers)


@dataclass
class _Scope:
    """What one HTTP request carries through its handler: its span, ids and timing."""

    route: str
    span: Span
    inference_id: str
    started: float = field(default_factory=time.perf_counter)
    model: str | None = None
    version: str | None = None
    finished: bool = False

    @property
    def context(self) -> Any:
        return trace.set_span_in_context(self.span)


def _replica_resource(service: str, version: str) -> dict[str, str]:
    ctx = serve.get_replica_context()
    replica = getattr(ctx.replica_id, "unique_id", None) or str(ctx.replica_id)
    return {
        attrs.SERVICE_NAME: service,
        attrs.SERVICE_VERSION: version,
        attrs.SERVICE_INSTANCE_ID: replica,
        attrs.SERVE_APP: ctx.app_name,
        attrs.SERVE_DEPLOYMENT: ctx.deployment,
        attrs.SERVE_REPLICA: replica,
    }


# Serve pickles the ingress class by value; helpers it calls are defined above it.
api = FastAPI(title="aiops serve")


@serve.ingress(api)
class Ingress:
    def __init__(self, handles: dict[str, DeploymentHandle],  # type: ignore[type-arg]
                 options: ServeOptions) -> None:
        self.handles = handles
        self.options = options
        self.specs = {s.name: s for s in options.specs}
        self.gates = {
            s.name: AdmissionController(
                capacity=s.autoscaling.max_replicas * s.max_ongoing_requests,
                max_queue={p: s.qos.max_queue for p in Priority})
            for s in options.specs}
        self.validators = {s.name: jsonschema.Draft202012Validator(s.input_schema)
                           for s in options.specs if s.input_schema}
        self.telemetry = Telemetry(options.telemetry, _replica_resource(INGRESS_NAME, "0.2.0"),
                                   component="ingress")
        meter = self.telemetry.meter
        self.http_duration = meter.create_histogram(
            "http.server.request.duration", unit="s", description="Ingress request duration")
        self.http_requests = meter.create_counter(
            "aiops.serve.requests", unit="{request}",
            description="Ingress responses by route, model and HTTP status code")
        meter.create_observable_gauge(
            "aiops.serve.queue_depth", callbacks=[self._observe_queues], unit="{request}",
            description="Requests waiting at the ingress for a model, by priority class")
        meter.create_observable_gauge(
            "aiops.serve.in_flight", callbacks=[self._observe_in_flight], unit="{request}",
            description="Requests admitted to a model and not yet answered")

    # -- observability ---------------------------------------------------------------------

    def _model_labels(self, spec: ModelSpec) -> dict[str, str]:
        return {attrs.GEN_AI_REQUEST_MODEL: spec.name, attrs.MODEL_VERSION: spec.version}

    def _observe_queues(self, _: CallbackOptions) -> Iterable[Observation]:
        for name, gate in self.gates.items():
            for p in Priority:
                yield Observation(gate.depth(p), {**self._model_labels(self.specs[name]),
                                                  "aiops.priority": p.value})

    def _observe_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        for name, gate in self.gates.items():
            yield Observation(gate.in_flight, self._model_labels(self.specs[name]))

    def _start(self, request: Request, route: str) -> _Scope:
        inference_id = uuid.uuid4().hex
        span = self.telemetry.tracer.start_span(
            f"POST {route}", context=extract_context(dict(request.headers)),
            kind=SpanKind.SERVER,
            attributes={attrs.HTTP_METHOD: "POST", attrs.HTTP_ROUTE: route,
                        attrs.INFERENCE_ID: inference_id})
        return _Scope(route, span, inference_id)

    def _finish(self, scope: _Scope, status: int, message: str | None = None) -> None:
        if scope.finished:
            return
        scope.finished = True
        labels: dict[str, Any] = {attrs.HTTP_ROUTE: scope.route, attrs.HTTP_STATUS: status}
        if scope.model:
            labels |= {attrs.GEN_AI_REQUEST_MODEL: scope.model,
                       attrs.MODEL_VERSION: scope.version or ""}
        with use_span(scope.span, end_on_exit=True):
            scope.span.set_attribute(attrs.HTTP_STATUS, status)
            if status >= 500:
                scope.span.set_status(Status(StatusCode.ERROR, message or str(status)))
            self.http_duration.record(time.perf_counter() - scope.started, labels)
            self.http_requests.add(1, labels)
            extra = {attrs.INFERENCE_ID: scope.inference_id, "http.status": status,
                     "model": scope.model or ""}
            # Successes are logged once, by the model replica (same inference_id); the ingress
            # logs what the model never saw: refusals and failures.
            if status >= 400:
                self.telemetry.logger.warning("%s answered %d: %s", scope.route, status,
                                              message, extra=extra)

    # -- request plumbing ------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if not authorized(request.headers.get("authorization"), self.options.api_keys):
            raise ApiError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                           type_="authentication_error", code="invalid_api_key")

    async def _json(self, request: Request) -> Any:
        limit = self.options.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        body = await request.body()
        if len(body) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from exc

    @staticmethod
    def _parse(model: type[M], raw: Any) -> M:
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            message, param = validation_message(exc)
            raise ApiError(400, message, param=param) from exc

    def _model(self, name: str, capability: str, scope: _Scope, raw: Any) -> ModelSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise ApiError(404, f"model {name!r} does not exist; see GET /v1/models",
                           param="model", code="model_not_found")
        scope.model, scope.version = spec.name, spec.version
        scope.span.set_attributes(self._model_labels(spec))
        if capability not in spec.capabilities:
            raise ApiError(400, f"model {name!r} ({spec.model_type.value}) does not support "
                           f"{capability}", param="model", code="unsupported_capability")
        validator = self.validators.get(spec.name)
        if validator is not None:
            error = next(iter(sorted(validator.iter_errors(raw), key=str)), None)
            if error is not None:
                path = ".".join(str(p) for p in error.absolute_path) or None
                raise ApiError(400, f"{path or 'body'}: {error.message} "
                               f"(input schema of {name})", param=path)
        return spec

    def _priority(self, request: Request, spec: ModelSpec) -> Priority:
        value = request.headers.get(PRIORITY_HEADER)
        if value is None:
            return spec.qos.priority
        try:
            return Priority(value)
        except ValueError:
            raise ApiError(400, f"{PRIORITY_HEADER} must be one of "
                           f"{', '.join(p.value for p in Priority)}") from None

    async def _admit(self, request: Request, spec: ModelSpec) -> Any:
        """Enter the model's admission gate; the caller must ``__aexit__`` the result."""
        slot = self.gates[spec.name].slot(self._priority(request, spec))
        try:
            await slot.__aenter__()
        except QueueFull as exc:
            raise ApiError(429, str(exc), type_="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(max(1, round(exc.retry_after_s)))}) \
                from exc
        return slot

    async def _call(self, spec: ModelSpec, call: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(call, spec.qos.timeout_s)
        except TimeoutError as exc:
            raise ApiError(504, f"model {spec.name} did not answer within "
                           f"{spec.qos.timeout_s:g} s", type_="timeout", code="timeout") from exc

    async def _endpoint(self, request: Request, route: str,
                        handler: Callable[[Request, Any, _Scope], Awaitable[Response]]
                        ) -> Response:
        scope = self._start(request, route)
        response: Response
        try:
            with use_span(scope.span, end_on_exit=False):
                self._authorize(request)
                raw = await self._json(request)
                response = await handler(request, raw, scope)
        except ApiError as exc:
            response = exc.response()
            self._finish(scope, exc.status, str(exc))
        except Exception as exc:
            log.exception("%s failed", route)
            response = ApiError(500, f"the model failed to answer: {type(exc).__name__}",
                                type_="server_error").response()
            self._finish(scope, 500, repr(exc))
        else:
            if not isinstance(response, StreamingResponse):
                self._finish(scope, response.status_code)
        headers: dict[str, str] = {"x-inference-id": scope.inference_id}
        inject_context(headers, context=scope.context)
        response.headers.update(headers)
        return response

    def _carrier(self, scope: _Scope) -> dict[str, str]:
        carrier: dict[str, str] = {}
        inject_context(carrier, context=scope.context)
        return carrier

    # -- routes ----------------------------------------------------------------------------

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": s.name, "object": "model", "created": 0, "owned_by": "aiops",
             "version": s.version, "model_type": s.model_type.value,
             "modalities": list(s.modalities), "capabilities": sorted(s.capabilities)}
            for s in self.specs.values()]}

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._endpoint(request, "/v1/chat/completions", self._chat)

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._endpoint(request, "/v1/completions", self._completion)

    @api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        return await self._endpoint(request, "/v1/embeddings", self._embeddings)

    # -- handlers --------------------------------------------------------------------------

    async def _chat(self, request: Request, raw: Any, scope: _Scope) -> Response:
        req = self._parse(ChatCompletionRequest, raw)
        images = [url for m in req.messages for url in m.image_urls()]
        spec = self._model(req.model, "vision" if images else "chat", scope, raw)
        completion_id = f"chatcmpl-{scope.inference_id}"
        if images:
            try:
                blobs = [decode_data_url(u) for u in images]
            except ImageError as exc:
                raise ApiError(400, str(exc), param="messages") from exc
            if req.stream:
                raise ApiError(400, f"model {spec.name} does not stream", param="stream")
            prompt = "\n".join(m.text() for m in req.messages)
            slot = await self._admit(request, spec)
            try:
                out = await self._call(spec, self.handles[spec.name].see.remote(
                    blobs, prompt, self._carrier(scope), scope.inference_id))
            finally:
                await slot.__aexit__(None, None, None)
            return JSONResponse(chat_completion_body(
                completion_id=completion_id, model=spec.name, text=out["text"],
                finish_reason=out["finish_reason"], prompt_tokens=out["prompt_tokens"],
                completion_tokens=out["completion_tokens"]))
        payload = {"messages": [{"role": m.role, "content": m.text()} for m in req.messages],
                   "max_tokens": req.effective_max_tokens(), "temperature": req.temperature,
                   "seed": req.seed, "stop": list(req.stop_list())}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._stream(request, spec, payload, scope, include_usage, chat=True,
                                      completion_id=completion_id)
        out = await self._generate(request, spec, payload, scope)
        return JSONResponse(chat_completion_body(
            completion_id=completion_id, model=spec.name, text=out["text"],
            finish_reason=out["finish_reason"], prompt_tokens=out["prompt_tokens"],
            completion_tokens=out["completion_tokens"]))

    async def _completion(self, request: Request, raw: Any, scope: _Scope) -> Response:
        req = self._parse(CompletionRequest, raw)
        spec = self._model(req.model, "completions", scope, raw)
        payload = {"prompt": req.prompt, "max_tokens": req.max_tokens,
                   "temperature": req.temperature, "seed": req.seed,
                   "stop": list(req.stop_list())}
        completion_id = f"cmpl-{scope.inference_id}"
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._stream(request, spec, payload, scope, include_usage, chat=False,
                                      completion_id=completion_id)
        out = await self._generate(request, spec, payload, scope)
        return JSONResponse(completion_body(
            completion_id=completion_id, model=spec.name, text=out["text"],
            finish_reason=out["finish_reason"], prompt_tokens=out["prompt_tokens"],
            completion_tokens=out["completion_tokens"]))

    async def _embeddings(self, request: Request, raw: Any, scope: _Scope) -> Response:
        req = self._parse(EmbeddingRequest, raw)
        spec = self._model(req.model, "embeddings", scope, raw)
        slot = await self._admit(request, spec)
        try:
            out = await self._call(spec, self.handles[spec.name].embed.remote(
                req.texts(), self._carrier(scope), scope.inference_id))
        finally:
            await slot.__aexit__(None, None, None)
        return JSONResponse(embeddings_body(spec.name, out["vectors"], out["tokens"],
                                            req.encoding_format))

    async def _generate(self, request: Request, spec: ModelSpec, payload: dict[str, Any],
                        scope: _Scope) -> dict[str, Any]:
        slot = await self._admit(request, spec)
        try:
            result: dict[str, Any] = await self._call(spec, self.handles[spec.name].generate.remote(
                payload, self._carrier(scope), scope.inference_id))
            return result
        finally:
            await slot.__aexit__(None, None, None)

    async def _stream(self, request: Request, spec: ModelSpec, payload: dict[str, Any],
                      scope: _Scope, include_usage: bool, *, chat: bool,
                      completion_id: str) -> StreamingResponse:
        slot = await self._admit(request, spec)
        handle = self.handles[spec.name].options(stream=True)
        deltas = handle.stream.remote(payload, self._carrier(scope), scope.inference_id)
        assert isinstance(deltas, DeploymentResponseGenerator)  # stream=True above
        deadline = time.monotonic() + spec.qos.timeout_s

        def chunk(**kw: Any) -> bytes:
            make = chat_chunk if chat else completion_chunk
            if not chat:
                kw.pop("role", None)
                if "content" in kw:
                    kw["text"] = kw.pop("content")
            return sse(make(completion_id, spec.name, **kw))

        async def events() -> AsyncIterator[bytes]:
            status, message = 200, None
            try:
                if chat:
                    yield chunk(role="assistant", content="")
                usage = None
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    try:
                        d = await asyncio.wait_for(deltas.__anext__(), remaining)
                    except StopAsyncIteration:
                        break
                    if d["text"]:
                        yield chunk(content=d["text"])
                    if d["finish_reason"] is not None:
                        yield chunk(finish_reason=d["finish_reason"])
                        usage = (d["prompt_tokens"], d["completion_tokens"])
                if include_usage and usage:
                    yield chunk(usage=usage)
                yield sse("[DONE]")
            except TimeoutError:
                status, message = 504, f"model {spec.name} did not finish within the deadline"
                yield sse(error_body(message, "timeout", code="timeout"))
            except Exception as exc:  # the stream's boundary: never a traceback to the client
                log.exception("stream failed")
                status, message = 500, f"the model failed while streaming: {type(exc).__name__}"
                yield sse(error_body(message, "server_error"))
            finally:
                deltas.cancel()  # type: ignore[no-untyped-call]
                await slot.__aexit__(None, None, None)
                self._finish(scope, status, message)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    def __del__(self) -> None:
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()


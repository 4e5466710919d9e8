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
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode, use_span
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentResponseGenerator

from aiops.identity import INGRESS_SERVICE
from serve.admission import QueueFull, Rerouted
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
from serve.openapi import openapi_response
from serve.responses import ApiError, Scope, answer, replica_resource
from serve.routing import ModelRoute, NoVersionServing, Version, build_routes
from serve.specs import ModelSpec, Priority
from serve.telemetry import (
    HTTP_DURATION_BUCKETS_S,
    Telemetry,
    TelemetryConfig,
    attrs,
    extract_context,
    inject_context,
)

__all__ = ["INGRESS_NAME", "Ingress", "api"]

log = logging.getLogger(__name__)

# Backends that can hold generation to a JSON schema (response_format).
CONSTRAINABLE = ("llama_cpp", "vllm")

INGRESS_NAME = INGRESS_SERVICE
PRIORITY_HEADER = "x-aiops-priority"
MODEL_VERSION_HEADER = "x-aiops-model-version"
M = TypeVar("M", bound=BaseModel)


# Serve pickles the ingress class by value; helpers it calls are defined above it.
api = FastAPI(title="aiops serve")


@serve.ingress(api)
class Ingress:
    def __init__(self, args: dict[str, Any]) -> None:
        tele = args["telemetry"]
        self.telemetry_config = TelemetryConfig(tele["endpoint"], tele["export_interval_s"],
                                                certificate_file=tele.get("certificate_file"),
                                                token=tele.get("token"))
        self.api_keys = tuple(args.get("api_keys", ()))
        self.max_request_bytes = int(args.get("max_request_bytes", 20 * 2**20))
        self.sticky_header = "x-aiops-session"
        self.routes: dict[str, ModelRoute] = {}
        self.telemetry = Telemetry(self.telemetry_config,
                                   replica_resource(INGRESS_NAME, "0.3.0"),
                                   component=INGRESS_NAME)
        meter = self.telemetry.meter
        self.http_duration = meter.create_histogram(
            "http.server.request.duration", unit="s", description="Ingress request duration",
            explicit_bucket_boundaries_advisory=HTTP_DURATION_BUCKETS_S)
        self.http_requests = meter.create_counter(
            "aiops.serve.requests", unit="{request}",
            description="Ingress responses by route, model, version and HTTP status code")
        meter.create_observable_gauge(
            "aiops.serve.queue_depth", callbacks=[self._observe_queues], unit="{request}",
            description="Requests waiting at the ingress for a model version, by priority")
        meter.create_observable_gauge(
            "aiops.serve.in_flight", callbacks=[self._observe_in_flight], unit="{request}",
            description="Requests admitted to a model version and not yet answered")
        meter.create_observable_gauge(
            "aiops.serve.traffic_weight", callbacks=[self._observe_weights], unit="%",
            description="Share of a model's traffic each version is configured to get")

    def reconfigure(self, config: dict[str, Any]) -> None:
        """The routing table, in place (Serve user_config): versions, weights, specs."""
        self.sticky_header = config.get("sticky_header", self.sticky_header)
        self.routes = build_routes(
            config, self.routes,
            lambda deployment, app: serve.get_deployment_handle(deployment, app_name=app))

    # -- observability ---------------------------------------------------------------------

    @staticmethod
    def _labels(v: Version) -> dict[str, str]:
        return {attrs.GEN_AI_REQUEST_MODEL: v.spec.name, attrs.MODEL_VERSION: v.version,
                attrs.ARTIFACT_DIGEST: v.digest}

    def _versions(self) -> list[Version]:
        return [v for r in list(self.routes.values()) for v in r.versions]

    def _observe_queues(self, _: CallbackOptions) -> Iterable[Observation]:
        for v in self._versions():
            for p in Priority:
                yield Observation(v.gate.depth(p), {**self._labels(v), attrs.PRIORITY: p.value})

    def _observe_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        for v in self._versions():
            yield Observation(v.gate.in_flight, self._labels(v))

    def _observe_weights(self, _: CallbackOptions) -> Iterable[Observation]:
        for v in self._versions():
            yield Observation(v.weight, self._labels(v))

    def _start(self, request: Request, route: str) -> Scope:
        inference_id = uuid.uuid4().hex
        span = self.telemetry.tracer.start_span(
            f"POST {route}", context=extract_context(dict(request.headers)),
            kind=SpanKind.SERVER,
            attributes={attrs.HTTP_METHOD: "POST", attrs.HTTP_ROUTE: route,
                        attrs.INFERENCE_ID: inference_id})
        return Scope(route, span, inference_id)

    def _finish(self, scope: Scope, status: int, message: str | None = None) -> None:
        if scope.finished:
            return
        scope.finished = True
        labels: dict[str, Any] = {attrs.HTTP_ROUTE: scope.route, attrs.HTTP_STATUS: status}
        if scope.target is not None:
            labels |= self._labels(scope.target)
        if scope.priority is not None:
            labels[attrs.PRIORITY] = scope.priority.value
        with use_span(scope.span, end_on_exit=True):
            scope.span.set_attribute(attrs.HTTP_STATUS, status)
            if status >= 500:
                scope.span.set_status(Status(StatusCode.ERROR, message or str(status)))
            self.http_duration.record(time.perf_counter() - scope.started, labels)
            self.http_requests.add(1, labels)
            extra = {attrs.INFERENCE_ID: scope.inference_id, "http.status": status,
                     **(self._labels(scope.target) if scope.target else {})}
            # Successes are logged once, by the model replica (same inference_id); the ingress
            # logs what the model never saw: refusals and failures.
            if status >= 400:
                self.telemetry.logger.warning("%s answered %d: %s", scope.route, status,
                                              message, extra=extra)

    # -- request plumbing ------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if not authorized(request.headers.get("authorization"), self.api_keys):
            raise ApiError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                           type_="authentication_error", code="invalid_api_key")

    async def _json(self, request: Request) -> Any:
        limit = self.max_request_bytes
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

    def _route(self, request: Request, name: str, scope: Scope) -> Version:
        route = self.routes.get(name)
        if route is None:
            raise ApiError(404, f"model {name!r} does not exist; see GET /v1/models",
                           param="model", code="model_not_found")
        try:
            target = route.pick(request.headers.get(self.sticky_header))
        except NoVersionServing as exc:
            raise ApiError(503, str(exc), type_="server_error", code="no_version_serving",
                           headers={"Retry-After": "5"}) from exc
        scope.target = target
        scope.span.set_attributes(self._labels(target))
        return target

    def _model(self, request: Request, name: str, capability: str, scope: Scope,
               raw: Any) -> Version:
        target = self._route(request, name, scope)
        spec = target.spec
        if capability not in spec.capabilities:
            raise ApiError(400, f"model {name!r} ({spec.model_type.value}) does not support "
                           f"{capability}", param="model", code="unsupported_capability")
        if target.validator is not None:
            error = next(iter(sorted(target.validator.iter_errors(raw), key=str)), None)
            if error is not None:
                path = ".".join(str(p) for p in error.absolute_path) or None
                raise ApiError(400, f"{path or 'body'}: {error.message} "
                               f"(input schema of {name})", param=path)
        return target

    def _priority(self, request: Request, spec: ModelSpec) -> Priority:
        value = request.headers.get(PRIORITY_HEADER)
        if value is None:
            return spec.qos.priority
        try:
            return Priority(value)
        except ValueError:
            raise ApiError(400, f"{PRIORITY_HEADER} must be one of "
                           f"{', '.join(p.value for p in Priority)}") from None

    async def _admit(self, request: Request, target: Version, scope: Scope
                     ) -> tuple[Any, Version]:
        """Enter a version's admission gate: the slot (the caller must ``__aexit__`` it) and
        the version, another one when the first stopped taking traffic while this waited."""
        priority = scope.priority = self._priority(request, target.spec)
        scope.span.set_attribute(attrs.PRIORITY, priority.value)
        while True:
            if priority in target.shed:
                raise ApiError(429, f"model {target.spec.name} is shedding {priority.value} "
                               "load; retry later", type_="rate_limit_error", code="load_shed",
                               headers={"Retry-After": "30"})
            slot = target.gate.slot(priority)
            try:
                await slot.__aenter__()
                return slot, target
            except QueueFull as exc:
                raise ApiError(429, str(exc), type_="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(max(1, round(exc.retry_after_s)))}
                               ) from exc
            except Rerouted:  # not started: the version now serving takes it
                target = self._route(request, target.spec.name, scope)

    @staticmethod
    def _class(scope: Scope, spec: ModelSpec) -> str:
        """The class a request was admitted in, for its replica (``serve.lanes``, vLLM's
        priority scheduling)."""
        return (scope.priority or spec.qos.priority).value

    async def _call(self, spec: ModelSpec, call: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(call, spec.qos.timeout_s)
        except TimeoutError as exc:
            raise ApiError(504, f"model {spec.name} did not answer within "
                           f"{spec.qos.timeout_s:g} s", type_="timeout", code="timeout") from exc

    async def _endpoint(self, request: Request, route: str,
                        handler: Callable[[Request, Any, Scope], Awaitable[Response]]
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
        if scope.target is not None:
            headers[MODEL_VERSION_HEADER] = scope.target.version
        inject_context(headers, context=scope.context)
        response.headers.update(headers)
        return response

    def _carrier(self, scope: Scope) -> dict[str, str]:
        carrier: dict[str, str] = {}
        inject_context(carrier, context=scope.context)
        return carrier

    # -- routes ----------------------------------------------------------------------------

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self, request: Request) -> Response:
        try:  # what is served is not public where API keys are set (as at OpenAI)
            self._authorize(request)
        except ApiError as exc:
            return exc.response()
        data = []
        for route in self.routes.values():
            s = route.primary.spec
            data.append({
                "id": route.name, "object": "model", "created": 0, "owned_by": "aiops",
                "version": s.version, "model_type": s.model_type.value,
                "modalities": list(s.modalities), "capabilities": sorted(s.capabilities),
                "versions": [{"version": v.version, "weight": v.weight, "digest": v.digest}
                             for v in route.versions]})
        return JSONResponse({"object": "list", "data": data})

    @api.get("/v1/models/{model}/openapi.json")
    async def model_openapi(self, request: Request, model: str,
                            version: str | None = None) -> Response:
        """The model's OpenAPI document, for client SDKs (serve/openapi.py)."""
        try:
            self._authorize(request)
        except ApiError as exc:
            return exc.response()
        return openapi_response(self.routes.get(model), model, version)

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

    async def _chat(self, request: Request, raw: Any, scope: Scope) -> Response:
        req = self._parse(ChatCompletionRequest, raw)
        images = [url for m in req.messages for url in m.image_urls()]
        target = self._model(request, req.model, "vision" if images else "chat", scope, raw)
        spec = target.spec
        completion_id = f"chatcmpl-{scope.inference_id}"
        if images:
            try:
                blobs = [decode_data_url(u) for u in images]
            except ImageError as exc:
                raise ApiError(400, str(exc), param="messages") from exc
            if req.stream:
                raise ApiError(400, f"model {spec.name} does not stream", param="stream")
            prompt = "\n".join(m.text() for m in req.messages)
            out = await self._admitted(request, target, scope, "see", blobs, prompt)
            return answer(chat_completion_body, completion_id, scope, out)
        payload = {"messages": [{"role": m.role, "content": m.text()} for m in req.messages],
                   "max_tokens": req.effective_max_tokens(), "temperature": req.temperature,
                   "seed": req.seed, "stop": list(req.stop_list())}
        schema = req.response_format.constraint() if req.response_format else None
        if schema is not None:
            if spec.backend not in CONSTRAINABLE:
                raise ApiError(400, f"model {spec.name} (backend {spec.backend}) cannot "
                               "constrain its output: response_format must be text",
                               param="response_format")
            payload["json_schema"] = schema
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._stream(request, target, payload, scope, include_usage, chat=True,
                                      completion_id=completion_id)
        out = await self._admitted(request, target, scope, "generate", payload)
        return answer(chat_completion_body, completion_id, scope, out)

    async def _completion(self, request: Request, raw: Any, scope: Scope) -> Response:
        req = self._parse(CompletionRequest, raw)
        target = self._model(request, req.model, "completions", scope, raw)
        payload = {"prompt": req.prompt, "max_tokens": req.max_tokens,
                   "temperature": req.temperature, "seed": req.seed,
                   "stop": list(req.stop_list())}
        completion_id = f"cmpl-{scope.inference_id}"
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._stream(request, target, payload, scope, include_usage, chat=False,
                                      completion_id=completion_id)
        out = await self._admitted(request, target, scope, "generate", payload)
        return answer(completion_body, completion_id, scope, out)

    async def _embeddings(self, request: Request, raw: Any, scope: Scope) -> Response:
        req = self._parse(EmbeddingRequest, raw)
        target = self._model(request, req.model, "embeddings", scope, raw)
        spec = target.spec
        out = await self._admitted(request, target, scope, "embed", req.texts())
        return JSONResponse(embeddings_body(spec.name, out["vectors"], out["tokens"],
                                            req.encoding_format))

    async def _admitted(self, request: Request, target: Version, scope: Scope, method: str,
                        *args: Any) -> dict[str, Any]:
        """Call ``method`` of the version's deployment inside an admission slot, with its
        deadline; the trace context and inference id go along."""
        slot, target = await self._admit(request, target, scope)
        try:
            result: dict[str, Any] = await self._call(
                target.spec, getattr(target.handle, method).remote(
                    *args, self._carrier(scope), scope.inference_id,
                    priority=self._class(scope, target.spec)))
            return result
        finally:
            await slot.__aexit__(None, None, None)

    async def _stream(self, request: Request, target: Version, payload: dict[str, Any],
                      scope: Scope, include_usage: bool, *, chat: bool,
                      completion_id: str) -> StreamingResponse:
        slot, target = await self._admit(request, target, scope)
        spec = target.spec
        handle = target.handle.options(stream=True)
        deltas = handle.stream.remote(payload, self._carrier(scope), scope.inference_id,
                                      priority=self._class(scope, spec))
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


"""The Ray Serve application: an OpenAI-compatible ingress and one deployment per model version.

This is the one place where Ray decorators meet the plain backend classes. (No
``from __future__ import annotations`` here: FastAPI must see real types through Serve's
ingress wrapper.) Request flow:
HTTP -> ``Ingress`` (W3C traceparent in, SERVER span, inference_id) -> ``ChatModel`` replica
(child span, OTel log record, GenAI metrics) -> response with ``traceparent`` and
``x-inference-id`` headers.
"""

import asyncio
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from aiops.config import Settings
from aiops.errors import ModelError
from serve.backends.base import ChatMessage, ChatRequest, get_backend
from serve.openai_api import (
    ChatCompletionRequest,
    chat_completion_body,
    error_body,
    validation_message,
)
from serve.telemetry import Telemetry, TelemetryConfig, attrs, extract_context, inject_context

__all__ = ["APP_NAME", "ModelOptions", "ServeOptions", "build_app"]

log = logging.getLogger(__name__)

APP_NAME = "aiops"
INGRESS_NAME = "ingress"


@dataclass(frozen=True)
class ModelOptions:
    name: str = "smollm2-135m-instruct"
    version: str = "v1"
    backend: str = "llama_cpp"
    num_cpus: float = 1.0
    threads: int = 2
    context: int = 2048

    @property
    def deployment_name(self) -> str:
        return f"{self.name}-{self.version}"


@dataclass(frozen=True)
class ServeOptions:
    telemetry: TelemetryConfig
    model: ModelOptions
    max_tokens_limit: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> "ServeOptions":
        return cls(
            telemetry=TelemetryConfig(settings.server_url, settings.otlp_export_interval_s),
            model=ModelOptions(num_cpus=settings.model_num_cpus, threads=settings.model_threads,
                               context=settings.model_context),
            max_tokens_limit=settings.max_tokens_limit,
        )


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


@serve.deployment(max_ongoing_requests=8)
class ChatModel:
    """One model version: a backend plus its instrumentation."""

    def __init__(self, options: ServeOptions) -> None:
        m = options.model
        self.model = m
        self.telemetry = Telemetry(options.telemetry, _replica_resource(m.name, m.version),
                                   component="model")
        meter = self.telemetry.meter
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s",
            description="Time the model replica spent on a request")
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Input and output tokens per request")
        self.requests = meter.create_counter(
            "aiops.model.requests", unit="{request}", description="Requests by outcome")
        self.backend = get_backend(m.backend)(
            model_name=m.name, n_ctx=m.context, n_threads=m.threads)
        self.backend.start()

    async def chat(self, payload: dict[str, Any], carrier: dict[str, str],
                   inference_id: str) -> dict[str, Any]:
        m = self.model
        labels = {attrs.GEN_AI_REQUEST_MODEL: m.name, attrs.MODEL_VERSION: m.version}
        request = ChatRequest(
            messages=tuple(ChatMessage(x["role"], x["content"]) for x in payload["messages"]),
            max_tokens=payload["max_tokens"], temperature=payload["temperature"],
            seed=payload.get("seed"))
        tracer = self.telemetry.tracer
        with tracer.start_as_current_span(
            f"chat {m.name}", context=extract_context(carrier), kind=SpanKind.INTERNAL,
            attributes={attrs.GEN_AI_OPERATION: "chat", attrs.GEN_AI_SYSTEM: m.backend,
                        attrs.GEN_AI_MAX_TOKENS: request.max_tokens,
                        attrs.INFERENCE_ID: inference_id, **labels},
        ) as span:
            started = time.perf_counter()
            try:
                # The backend blocks; run it off the replica's event loop.
                result = await asyncio.to_thread(self.backend.chat, request)
            except ModelError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self.requests.add(1, {**labels, "outcome": "error"})
                self.telemetry.logger.error("inference failed: %s", exc,
                                            extra={attrs.INFERENCE_ID: inference_id, **labels})
                raise
            elapsed = time.perf_counter() - started
            span.set_attributes({
                attrs.GEN_AI_RESPONSE_MODEL: m.name,
                attrs.GEN_AI_INPUT_TOKENS: result.prompt_tokens,
                attrs.GEN_AI_OUTPUT_TOKENS: result.completion_tokens,
                attrs.GEN_AI_FINISH_REASONS: [result.finish_reason],
            })
            # Recorded inside the span so histogram exemplars carry this trace id.
            self.duration.record(elapsed, labels)
            self.tokens.record(result.prompt_tokens, {**labels, attrs.GEN_AI_TOKEN_TYPE: "input"})
            self.tokens.record(result.completion_tokens,
                               {**labels, attrs.GEN_AI_TOKEN_TYPE: "output"})
            self.requests.add(1, {**labels, "outcome": "ok"})
            self.telemetry.logger.info(
                "chat completion in %.3f s: %d prompt tokens, %d completion tokens, %s",
                elapsed, result.prompt_tokens, result.completion_tokens, result.finish_reason,
                extra={attrs.INFERENCE_ID: inference_id, **labels})
        return asdict(result)

    def __del__(self) -> None:
        # Serve calls __del__ when it stops a replica: flush what is still queued.
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.shutdown()


api = FastAPI(title="aiops serve")


@serve.deployment(max_ongoing_requests=64)
@serve.ingress(api)
class Ingress:
    """OpenAI-compatible HTTP front door."""

    def __init__(
        self, chat_model: DeploymentHandle, options: ServeOptions  # type: ignore[type-arg]
    ) -> None:
        self.chat_model = chat_model
        self.config = options
        self.telemetry = Telemetry(options.telemetry, _replica_resource(INGRESS_NAME, "0.1.0"),
                                   component="ingress")
        self.http_duration = self.telemetry.meter.create_histogram(
            "http.server.request.duration", unit="s", description="Ingress request duration")

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        m = self.config.model
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "owned_by": "aiops", "version": m.version}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> JSONResponse:
        route = "/v1/chat/completions"
        inference_id = uuid.uuid4().hex
        started = time.perf_counter()
        with self.telemetry.tracer.start_as_current_span(
            f"POST {route}", context=extract_context(dict(request.headers)),
            kind=SpanKind.SERVER,
            attributes={attrs.HTTP_METHOD: "POST", attrs.HTTP_ROUTE: route,
                        attrs.INFERENCE_ID: inference_id},
        ) as span:
            status, body = await self._chat(request, inference_id)
            span.set_attribute(attrs.HTTP_STATUS, status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, body["error"]["message"]))
            headers = {"x-inference-id": inference_id}
            inject_context(headers)
            self.http_duration.record(time.perf_counter() - started,
                                      {attrs.HTTP_ROUTE: route, attrs.HTTP_STATUS: status})
        return JSONResponse(body, status_code=status, headers=headers)

    async def _chat(self, request: Request, inference_id: str) -> tuple[int, dict[str, Any]]:
        log_extra = {attrs.INFERENCE_ID: inference_id}
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return 400, error_body(f"request body is not valid JSON: {exc}")
        try:
            req = ChatCompletionRequest.model_validate(raw)
        except ValidationError as exc:
            message, param = validation_message(exc)
            return 400, error_body(message, param=param)
        model = self.config.model
        if req.model != model.name:
            return 404, error_body(f"model {req.model!r} does not exist; serving {model.name!r}",
                                   param="model", code="model_not_found")
        if req.max_tokens > self.config.max_tokens_limit:
            return 400, error_body(
                f"max_tokens must be at most {self.config.max_tokens_limit}",
                param="max_tokens")
        if req.stream:
            return 400, error_body("streaming is not supported yet", param="stream")
        carrier: dict[str, str] = {}
        inject_context(carrier)
        try:
            result = await self.chat_model.chat.remote(req.model_dump(), carrier, inference_id)
        except Exception as exc:  # noqa: BLE001 - the HTTP boundary: never leak a traceback
            self.telemetry.logger.error("model call failed: %s", exc, extra=log_extra)
            return 500, error_body("the model failed to answer", type_="server_error")
        self.telemetry.logger.info("chat request answered by %s", model.deployment_name,
                                   extra=log_extra)
        return 200, chat_completion_body(
            completion_id=f"chatcmpl-{inference_id}", model=model.name, text=result["text"],
            finish_reason=result["finish_reason"], prompt_tokens=result["prompt_tokens"],
            completion_tokens=result["completion_tokens"])

    def __del__(self) -> None:
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()


def build_app(options: ServeOptions) -> serve.Application:
    m = options.model
    # mypy sees the classes; Serve's decorators turned them into Deployments.
    model = ChatModel.options(  # type: ignore[attr-defined]
        name=m.deployment_name,
        ray_actor_options={"num_cpus": m.num_cpus},
    ).bind(options)
    ingress = Ingress.options(  # type: ignore[attr-defined]
        name=INGRESS_NAME, ray_actor_options={"num_cpus": 0.1})
    return ingress.bind(model, options)  # type: ignore[no-any-return]

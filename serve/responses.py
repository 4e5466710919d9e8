"""What the ingress carries per request and answers with: the request's scope (span, ids,
routed version), OpenAI-style errors raised in handlers, and completion bodies naming the
version that answered."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from opentelemetry import trace
from opentelemetry.trace import Span
from ray import serve

from serve.openai_api import error_body
from serve.routing import Version
from serve.specs import Priority
from serve.telemetry import attrs

__all__ = ["ApiError", "Scope", "answer", "fingerprint", "replica_resource"]


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
class Scope:
    """What one HTTP request carries through its handler: its span, ids and timing."""

    route: str
    span: Span
    inference_id: str
    started: float = field(default_factory=time.perf_counter)
    target: Version | None = None
    priority: Priority | None = None  # once known (admission)
    finished: bool = False

    @property
    def context(self) -> Any:
        return trace.set_span_in_context(self.span)


def replica_resource(service: str, version: str) -> dict[str, str]:
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


def answer(make: Callable[..., dict[str, Any]], completion_id: str, scope: Scope,
            out: dict[str, Any]) -> JSONResponse:
    """A (chat) completion body from a model's result dict (the version that answered)."""
    target = scope.target
    assert target is not None  # set when the request was routed
    return JSONResponse(make(
        completion_id=completion_id, model=target.spec.name, text=out["text"],
        finish_reason=out["finish_reason"], prompt_tokens=out["prompt_tokens"],
        completion_tokens=out["completion_tokens"], fingerprint=fingerprint(target)))


def fingerprint(target: Version) -> str:
    """OpenAI's system_fingerprint: which backend configuration answered (version + digest)."""
    return f"{target.version}:{target.digest.removeprefix('sha256:')[:12]}"

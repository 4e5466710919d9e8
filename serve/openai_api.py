"""OpenAI-compatible request/response models and error bodies (the subset served so far)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ChatCompletionRequest",
    "Message",
    "chat_completion_body",
    "error_body",
    "validation_message",
]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=32_000)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    seed: int | None = None
    stream: bool = False


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """A readable message and the first offending parameter, from pydantic's errors."""
    parts, param = [], None
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        param = param or loc or None
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts), param


def error_body(message: str, type_: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def chat_completion_body(*, completion_id: str, model: str, text: str, finish_reason: str,
                         prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }

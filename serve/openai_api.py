"""OpenAI-compatible request models, response bodies and errors.

Requests are validated with pydantic (field errors become 400s in OpenAI's error shape);
responses are plain dicts in the shapes the official ``openai`` client parses.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "ImageError",
    "ResponseFormat",
    "chat_chunk",
    "chat_completion_body",
    "completion_body",
    "completion_chunk",
    "embeddings_body",
    "error_body",
    "sse",
    "validation_message",
]


class _Lenient(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do (clients send extras).
    model_config = ConfigDict(extra="ignore")


class ImageUrl(_Lenient):
    url: str = Field(max_length=30_000_000)


class ContentPart(_Lenient):
    type: Literal["text", "image_url"]
    text: str | None = Field(None, max_length=32_000)
    image_url: ImageUrl | None = None


class Message(_Lenient):
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart] = Field(max_length=32_000)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text or "" for p in self.content if p.type == "text")

    def image_urls(self) -> list[str]:
        if isinstance(self.content, str):
            return []
        return [p.image_url.url for p in self.content
                if p.type == "image_url" and p.image_url is not None]


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    model: str = Field(min_length=1, max_length=200)
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop[:4])


class JsonSchemaFormat(_Lenient):
    name: str = Field("answer", max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs json_schema.schema")
        if self.json_schema is not None and len(json.dumps(self.json_schema.schema_)) > 32_000:
            raise ValueError("response_format.json_schema.schema is over 32,000 characters")
        return self

    def constraint(self) -> str | None:
        """The JSON schema text the backend must honour ("{}": any JSON object; None: text)."""
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema is None:
            return "{}"
        return json.dumps(self.json_schema.schema_, sort_keys=True)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None

    def effective_max_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str = Field(max_length=32_000)
    max_tokens: int = Field(16, ge=1)  # OpenAI's default for completions


class EmbeddingRequest(_Lenient):
    model: str = Field(min_length=1, max_length=200)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ImageError(ValueError):
    """An image part that is not a usable data URL."""


def decode_data_url(url: str) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL. Remote URLs are refused: the server
    fetches nothing from the network."""
    if not url.startswith("data:"):
        raise ImageError("image_url must be a data URL (data:image/png;base64,...); "
                         "this server does not fetch remote images")
    header, _, payload = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64"):
        raise ImageError("image_url must be a base64 image data URL (data:image/<type>;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image_url data is not valid base64: {exc}") from exc


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


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_completion_body(*, completion_id: str, model: str, text: str, finish_reason: str,
                         prompt_tokens: int, completion_tokens: int,
                         fingerprint: str | None = None) -> dict[str, Any]:
    return {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()),
        "model": model, "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def completion_body(*, completion_id: str, model: str, text: str, finish_reason: str,
                    prompt_tokens: int, completion_tokens: int,
                    fingerprint: str | None = None) -> dict[str, Any]:
    return {
        "id": completion_id, "object": "text_completion", "created": int(time.time()),
        "model": model, "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def chat_chunk(completion_id: str, model: str, *, content: str | None = None,
               role: str | None = None, finish_reason: str | None = None,
               usage: tuple[int, int] | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body: dict[str, Any] = {
        "id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model,
        "choices": [] if usage else [{"index": 0, "delta": delta,
                                      "finish_reason": finish_reason}],
    }
    if usage:
        body["usage"] = _usage(*usage)
    return body


def completion_chunk(completion_id: str, model: str, *, text: str = "",
                     finish_reason: str | None = None,
                     usage: tuple[int, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion_id, "object": "text_completion", "created": int(time.time()),
        "model": model,
        "choices": [] if usage else [{"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": finish_reason}],
    }
    if usage:
        body["usage"] = _usage(*usage)
    return body


def embeddings_body(model: str, vectors: list[list[float]], tokens: int,
                    encoding_format: str) -> dict[str, Any]:
    def encode(v: list[float]) -> list[float] | str:
        if encoding_format == "base64":
            return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
        return v

    return {
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event; ``"[DONE]"`` ends an OpenAI stream."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()

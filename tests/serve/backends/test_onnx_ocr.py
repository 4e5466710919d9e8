"""The vision model reads text out of an image, offline."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from PIL import Image, ImageDraw, ImageFont

from aiops.errors import ModelError
from serve.backends.onnx_ocr import OnnxOcrBackend
from serve.specs import ModelSpec


def text_image(text: str) -> bytes:
    img = Image.new("RGB", (520, 120), "white")
    ImageDraw.Draw(img).text((20, 30), text, fill="black", font=ImageFont.load_default(size=40))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def backend(default_specs: dict[str, ModelSpec]) -> Iterator[OnnxOcrBackend]:
    b = OnnxOcrBackend(default_specs["vision"])
    b.start()
    yield b
    b.shutdown()


def test_it_reads_the_text_in_an_image(backend: OnnxOcrBackend) -> None:
    out = backend.see([text_image("replica restarted")], "What does it say?")
    assert out.text == "replica restarted"
    assert out.completion_tokens == 2


def test_a_blank_image_reads_as_nothing(backend: OnnxOcrBackend) -> None:
    blank = io.BytesIO()
    Image.new("RGB", (64, 64), "white").save(blank, "PNG")
    assert backend.see([blank.getvalue()], "").text == ""


def test_bytes_that_are_not_an_image_are_a_model_error(backend: OnnxOcrBackend) -> None:
    with pytest.raises(ModelError, match="not a readable image"):
        backend.see([b"definitely not a png"], "")


def test_it_runs_on_the_threads_its_spec_gives_it_not_one_per_core(
        backend: OnnxOcrBackend) -> None:
    # A replica is scheduled for a share of a core; ONNX Runtime's default (one thread per
    # core) would let each request take every core of the node.
    engine = backend._engine
    for part in (engine.text_det.infer, engine.text_cls.infer, engine.text_rec.session):
        opts = part.session.get_session_options()
        assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


def test_the_detector_keeps_a_small_image_small_and_still_reads_it(
        backend: OnnxOcrBackend) -> None:
    # RapidOCR's own default scales the shorter side up to 736 px (a 200x48 screenshot to
    # ~3000x736, most of a second of CPU); PaddleOCR's caps the longer side at 960.
    det = backend._engine.text_det
    assert (det.limit_type, det.limit_side_len) == ("max", 960)
    img = Image.new("RGB", (200, 48), "white")
    ImageDraw.Draw(img).text((8, 16), "GPU 0 OK", fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    assert backend.see([buf.getvalue()], "").text == "GPU 0 OK"


def test_a_detector_resize_it_cannot_use_is_refused(
        default_specs: dict[str, ModelSpec]) -> None:
    spec = default_specs["vision"]
    for wrong in ({"det_limit_type": "sideways"}, {"det_limit_side_len": 100_000}):
        bad = spec.model_copy(update={"options": {**spec.options, **wrong}})
        with pytest.raises(ModelError, match="det_limit_type is max or min"):
            OnnxOcrBackend(bad)

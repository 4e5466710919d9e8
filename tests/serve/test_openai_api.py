"""OpenAI request parsing and response shapes."""

import base64
import json
import struct

import pytest
from pydantic import ValidationError

from serve.openai_api import (
    ChatCompletionRequest,
    ImageError,
    chat_chunk,
    decode_data_url,
    embeddings_body,
    sse,
)


def test_image_parts_and_text_are_separated() -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "read this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
    assert req.messages[0].text() == "read this"
    assert req.messages[0].image_urls() == ["data:image/png;base64,AAAA"]
    assert req.effective_max_tokens() == 128


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
         "max_completion_tokens": 9})
    assert req.effective_max_tokens() == 9


@pytest.mark.parametrize(("url", "message"), [
    ("https://example.com/cat.png", "does not fetch remote images"),
    ("data:text/plain;base64,AAAA", "base64 image data URL"),
    ("data:image/png,rawbytes", "base64 image data URL"),
    ("data:image/png;base64,!!!", "not valid base64"),
])
def test_only_base64_image_data_urls_are_accepted(url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        decode_data_url(url)
    assert decode_data_url("data:image/png;base64,AAEC") == b"\x00\x01\x02"


def test_base64_embeddings_are_little_endian_float32() -> None:
    body = embeddings_body("m", [[0.5, -1.0]], 3, "base64")
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (0.5, -1.0)
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_stream_events_and_the_usage_chunk() -> None:
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    event = json.loads(sse(chat_chunk("id", "m", content="hi"))[6:])
    assert event["choices"][0]["delta"] == {"content": "hi"}
    usage = chat_chunk("id", "m", usage=(3, 4))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7


def test_response_format_reads_as_a_schema_constraint() -> None:
    def fmt(rf: dict[str, object]) -> str | None:
        req = ChatCompletionRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": rf})
        assert req.response_format is not None
        return req.response_format.constraint()

    assert fmt({"type": "text"}) is None
    assert fmt({"type": "json_object"}) == "{}"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(fmt({"type": "json_schema", "json_schema": {"name": "x",
                                                                  "schema": schema}}) or "") \
        == schema
    with pytest.raises(ValidationError, match="needs json_schema"):
        fmt({"type": "json_schema"})

"""The OpenAI-compatible endpoints, driven by the official `openai` client against the real
stack (session fixture `stack`, models from tests/models-test.yaml)."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
from PIL import Image, ImageDraw, ImageFont

from aiops.client import ServerClient
from aiops.config import Settings

pytestmark = pytest.mark.stack

CHAT = "smollm2-135m-instruct"
EMBED = "minilm-l6-v2"
VISION = "ppocr-v4"


@pytest.fixture(scope="module")
def client(stack: Settings) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.serve_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_every_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [CHAT, EMBED, VISION]


def test_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Paris is the capital of which "
                                                         "country?"}],
        max_tokens=16, temperature=0)
    assert "France" in (out.choices[0].message.content or "")
    assert out.usage is not None and out.usage.prompt_tokens > 5


def test_response_format_json_schema_constrains_the_chat_model(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"country": {"enum": ["France", "Spain"]}},
              "required": ["country"]}
    out = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Paris is in which country?"}],
        max_tokens=24, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    assert json.loads(out.choices[0].message.content or "") == {"country": "France"}


def test_a_json_schema_format_without_its_schema_is_a_400(stack: Settings) -> None:
    r = httpx.post(f"{stack.serve_url}/v1/chat/completions", json={
        "model": CHAT, "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and "needs json_schema" in r.text


def test_streaming_chat_matches_the_whole_answer(client: openai.OpenAI) -> None:
    ask = {"model": CHAT, "messages": [{"role": "user", "content": "Name a color."}],
           "max_tokens": 12, "temperature": 0.0, "seed": 3}
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(  # type: ignore[call-overload]
        **ask, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    out = client.completions.create(model=CHAT, prompt="One, two, three,", max_tokens=5,
                                    temperature=0)
    assert out.choices[0].text and out.usage is not None and out.usage.completion_tokens == 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=CHAT, prompt="One, two, three,", max_tokens=5, temperature=0, stream=True)
        if c.choices)
    assert streamed == out.choices[0].text


def test_embeddings_in_both_encodings(client: openai.OpenAI, stack: Settings) -> None:
    # The openai client asks for base64 and decodes it; plain HTTP gets floats.
    out = client.embeddings.create(
        model=EMBED, input=["the GPU ran out of memory", "CUDA out of memory error"])
    a, b = (np.array(d.embedding) for d in out.data)
    assert a.shape == (384,) and 0.5 < float(a @ b) <= 1.0
    raw = httpx.post(f"{stack.serve_url}/v1/embeddings",
                     json={"model": EMBED, "input": "the GPU ran out of memory"}).json()
    assert np.allclose(raw["data"][0]["embedding"], a, atol=1e-6)


def test_each_class_is_served_and_named_on_the_ingress_span(stack: Settings) -> None:
    # Realtime runs on the replica's default threads, batch on its low-priority lane
    # (serve.lanes): both answer the same, and the span says which class each was.
    ids = {}
    vectors = {}
    for cls in ("realtime", "batch"):
        r = httpx.post(f"{stack.serve_url}/v1/embeddings", headers={"x-aiops-priority": cls},
                       json={"model": EMBED, "input": "the GPU ran out of memory"})
        assert r.status_code == 200, r.text
        ids[cls] = r.headers["x-inference-id"]
        vectors[cls] = np.array(r.json()["data"][0]["embedding"])
    assert np.allclose(vectors["realtime"], vectors["batch"], atol=1e-6)
    with ServerClient(stack.server_url) as db:
        deadline = time.monotonic() + 30
        seen: dict[str, str] = {}
        while len(seen) < 2 and time.monotonic() < deadline:
            seen = {r["id"]: r["priority"] for r in db.rows(
                "SELECT (attributes->>'inference_id') AS id, "
                "(attributes->>'aiops.priority') AS priority FROM spans "
                "WHERE (attributes->>'inference_id') IN (?, ?) AND parent_span_id IS NULL",
                [ids["realtime"], ids["batch"]])}
            time.sleep(0.5)
    assert seen == {ids["realtime"]: "realtime", ids["batch"]: "batch"}


def image_data_url(text: str) -> str:
    img = Image.new("RGB", (520, 120), "white")
    ImageDraw.Draw(img).text((20, 30), text, fill="black", font=ImageFont.load_default(size=40))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_an_image_part_reaches_the_vision_model(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=VISION, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What does the screenshot say?"},
        {"type": "image_url", "image_url": {"url": image_data_url("replica restarted")}}]}])
    assert out.choices[0].message.content == "replica restarted"


@pytest.mark.parametrize(("model", "content", "message"), [
    (CHAT, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
     "does not support vision"),
    (VISION, [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}],
     "does not fetch remote images"),
    (VISION, "no image here", "does not support chat"),
])
def test_misrouted_or_remote_images_get_400(client: openai.OpenAI, model: str,
                                            content: object, message: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}])  # type: ignore[misc]
    assert message in str(info.value)


def test_a_request_outside_the_models_input_schema_gets_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    assert "max_tokens" in str(info.value) and "input schema" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="does not support embeddings"):
        client.embeddings.create(model=CHAT, input="x")


def test_an_oversized_body_gets_413(stack: Settings) -> None:
    big = b'{"model": "x", "input": "' + b"a" * (stack.max_request_bytes + 1) + b'"}'
    resp = httpx.post(f"{stack.serve_url}/v1/embeddings", content=big,
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 413 and "exceeds" in resp.json()["error"]["message"]


def _stream_chat(url: str) -> tuple[int, str | None]:
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": CHAT, "messages": [{"role": "user", "content": "Count from 1 to 50."}],
        "max_tokens": 48, "stream": True})
    return resp.status_code, resp.headers.get("retry-after")


def test_a_full_queue_gets_429_with_retry_after_and_the_rest_are_served(
    stack: Settings,
) -> None:
    # Capacity 2 (2 replicas x 1 ongoing) + 3 queued: of 9 at once, some must be refused.
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        results = list(pool.map(lambda _: _stream_chat(stack.serve_url), range(9)))
    statuses = [s for s, _ in results]
    assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
    assert all(retry == "1" for s, retry in results if s == 429)
    assert set(statuses) <= {200, 429}


def _latest_replicas(client: ServerClient) -> int | None:
    rows = client.rows(
        "SELECT value FROM metric_points WHERE name = 'aiops.serve.replicas' "
        "AND (attributes->>'ray.serve.deployment') = ? ORDER BY time DESC LIMIT 1",
        [f"{CHAT}-v1"])
    return int(rows[0]["value"]) if rows else None


def test_load_scales_the_chat_model_out_and_back_in(stack: Settings) -> None:
    with ServerClient(stack.server_url) as db:
        # The 429 test before this one scaled it out; scale-in (3 s delay, then a graceful
        # replica shutdown) took over 30 s once on a loaded 2-core CI machine.
        deadline = time.monotonic() + 120
        while _latest_replicas(db) != 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _latest_replicas(db) == 1, "the chat model never settled at one replica"
        seen = {1}
        stop = time.monotonic() + 60
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            # Three clients in a loop keep ~3 requests ongoing: target is 1 per replica.
            def load(_: int) -> None:
                while time.monotonic() < stop and 2 not in seen:
                    _stream_chat(stack.serve_url)

            futures = [pool.submit(load, i) for i in range(3)]
            while time.monotonic() < stop and 2 not in seen:
                time.sleep(0.5)
                seen.add(_latest_replicas(db) or 0)
            for f in futures:
                f.result()
        assert 2 in seen, "the chat model never scaled out under load"
        deadline = time.monotonic() + 120
        while _latest_replicas(db) != 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _latest_replicas(db) == 1, "the chat model did not scale back in"


def test_streamed_requests_record_time_to_first_token(stack: Settings) -> None:
    with ServerClient(stack.server_url) as db:
        deadline = time.monotonic() + 20
        names: set[str] = set()
        while time.monotonic() < deadline:
            names = {r["name"] for r in db.rows(
                "SELECT DISTINCT name FROM metric_points WHERE service_name = ?", [CHAT])}
            if "gen_ai.server.time_to_first_token" in names:
                break
            time.sleep(0.5)
    assert {"gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
            "aiops.model.kv_cache.usage", "gen_ai.client.token.usage"} <= names

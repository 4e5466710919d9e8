"""The agent with the embedded model, on the real stack: the evaluation's pass rate with the
LLM narrative, and a chat-ops question answered through the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from aiops.config import Settings
from aiops.lifecycle import admin_token
from aiops.stack import settings_env

pytestmark = pytest.mark.stack


# Its own limit: the session's stack starts inside it (~1 min) and 36 narratives take ~4 min on
# 2 cores; the eval stops asking an LLM that failed three cases in a row, so a hung endpoint
# ends it in minutes too.
@pytest.mark.timeout(1200)
def test_the_eval_passes_with_the_embedded_model_writing_the_narratives(
        stack: Settings) -> None:
    # A child process whose per-case progress (stderr) reaches pytest's capture as it happens:
    # a failure or a timeout shows how far the eval got and how long each case took.
    done = subprocess.run([sys.executable, "-m", "aiops", "eval", "--llm", "stack", "--json"],
                          env={**os.environ, **settings_env(stack)}, stdout=subprocess.PIPE,
                          text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    print(f"aiops eval --llm stack: facts {report['pass_rate']:.1%}, with the narrative "
          f"{report['pass_rate_with_narrative']:.1%} of {report['cases']} cases")
    slowest = sorted(report["results"], key=lambda r: -r["seconds"])[:5]
    print("slowest cases: " + ", ".join(f"{r['case']} {r['seconds']:.1f} s" for r in slowest))
    assert report["cases"] >= 30 and report["pass_rate"] >= 0.9
    assert report["llm"] == "smollm2-135m-instruct"
    # The narratives were asked of the model, and at least some of them stood.
    assert report["pass_rate_with_narrative"] > 0
    assert any(r["narrative_source"] == "llm" for r in report["results"])


def test_a_chat_ops_question_is_answered_with_the_served_model(stack: Settings) -> None:
    r = httpx.post(f"{stack.server_url}/v1/chatops", timeout=120, json={
        "question": "What happened to smollm2-135m-instruct in the last 15 minutes?"},
        headers={"authorization": f"Bearer {admin_token(stack)}"})  # asking: operator
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["intent"]["model"] == "smollm2-135m-instruct"
    assert answer["narrative"]["source"] in ("llm", "template")
    assert answer["text"]

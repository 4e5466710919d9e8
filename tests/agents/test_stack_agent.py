"""The agent with the embedded model, on the real stack: the evaluation's pass rate with the
LLM narrative, and a chat-ops question answered through the server."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from aiops.cli import app
from aiops.config import Settings
from aiops.lifecycle import admin_token
from aiops.stack import settings_env

pytestmark = pytest.mark.stack


def test_the_eval_passes_with_the_embedded_model_writing_the_narratives(
        stack: Settings) -> None:
    result = CliRunner().invoke(app, ["eval", "--llm", "stack", "--json"],
                                env=settings_env(stack))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    print(f"aiops eval --llm stack: facts {report['pass_rate']:.1%}, with the narrative "
          f"{report['pass_rate_with_narrative']:.1%} of {report['cases']} cases")
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

"""Chat-ops over HTTP on the real server: JSON questions, and Slack's slash command with its
signature, 3-second acknowledgement and follow-up to ``response_url``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agents.chatops import AgentService, make_router
from agents.settings import AgentSettings, SlackSettings
from aiops.auth import TOKENS_FILE, Authenticator, Role, TokenStore
from aiops.config import Settings, load_settings
from aiops.remediation.policy import DEMO_POLICY
from aiops.server.guard import Guards
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.agents.scenario import slow_canary
from tests.agents.slack import response_receiver, signed
from tests.conftest import RunningServer

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN = "admin-t0ken-for-chatops"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
QUESTION = "What happened to echo in the last 15 minutes?"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The server's settings, with a slow canary already analysed in its store (the tools
    look back from the real clock)."""
    s = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                      serve_port=free_port(), control_port=free_port(), scrape_targets="",
                      analytics=False, agent_llm_url="none", admin_token=TOKEN,
                      slack_signing_secret=SECRET, slack_response_hosts="127.0.0.1",
                      policy_file=DEMO_POLICY)
    s.data_dir.mkdir(parents=True)
    store = Store(s.db_path)
    slow_canary(store, time.time_ns())
    store.close()
    return s


def test_a_question_gets_facts_evidence_and_ids(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": QUESTION}, headers=ADMIN,
                   timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["facts"]["component"], answer["facts"]["version"]) == ("echo", "v2")
    trace = next(e["id"] for e in answer["evidence"] if e["kind"] == "trace")
    assert answer["facts"]["incident_id"] in answer["text"] and trace in answer["text"]


@pytest.mark.parametrize("body", [{}, {"question": ""}, {"question": "x" * 2001},
                                  {"question": "hi", "user": "a b"}])
def test_malformed_questions_are_400s(server: RunningServer, body: dict[str, Any]) -> None:
    r = httpx.post(f"{server.url}/v1/chatops", json=body, headers=ADMIN)
    assert r.status_code == 400 and "invalid request" in r.json()["error"]


def _token(settings: Settings, name: str, role: Role) -> dict[str, str]:
    token = TokenStore(settings.data_dir / TOKENS_FILE).add(name, role)
    return {"authorization": f"Bearer {token}"}


def test_chatops_needs_an_operator_token(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "roll back echo"}, timeout=60)
    assert r.status_code == 401
    viewer = _token(server.settings, "watcher", Role.VIEWER)
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "roll back echo"},
                   headers=viewer, timeout=60)
    assert r.status_code == 403 and "operator" in r.text
    assert server.store.count("actions") == 0
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "roll back echo",
                                                     "user": "alice"},
                   headers=ADMIN, timeout=60)
    # The demo policy allows it; with no Serve control plane running, it fails, on record.
    assert r.json()["proposal"]["data"]["status"] == "failed"
    actors = [a for (a,) in server.store.query("SELECT actor FROM ledger ORDER BY seq").rows]
    assert actors[0] == "agent:alice"


def test_an_operator_proposes_and_only_an_admin_approves(server: RunningServer) -> None:
    operator = _token(server.settings, "oncall", Role.OPERATOR)
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "scale echo", "user": "olga"},
                   headers=operator, timeout=60)
    pending = r.json()["proposal"]["data"]  # the demo policy wants scaling approved
    assert r.status_code == 200 and pending["status"] == "pending", r.text
    r = httpx.post(f"{server.url}/v1/chatops",
                   json={"question": f"approve {pending['action_id']}", "user": "olga"},
                   headers=operator, timeout=60)
    assert r.json()["proposal"]["status"] == "error"
    assert "needs the admin role" in r.json()["proposal"]["error"]
    assert "needs the admin role" in r.json()["text"]
    r = httpx.post(f"{server.url}/v1/chatops",
                   json={"question": f"deny {pending['action_id']}", "user": "ada"},
                   headers=ADMIN, timeout=60)
    assert r.json()["proposal"]["data"]["status"] == "denied", r.text
    ledger = [(actor, json.loads(entry)["status"]) for actor, entry in
              server.store.query("SELECT actor, entry FROM ledger ORDER BY seq").rows]
    assert ledger[-1] == ("agent:ada", "denied")
    assert ("agent:olga", "approved") not in ledger


def test_more_questions_than_slots_get_a_retryable_429(settings: Settings,
                                                       store: Store) -> None:
    service = AgentService(AgentSettings.of(settings), store, slack=SlackSettings.of(settings))
    app = FastAPI()
    app.include_router(make_router(service, Guards(Authenticator.from_settings(settings))))
    assert service._slots.acquire(blocking=False)
    try:
        for _ in range(settings.agent_max_concurrent - 1):
            assert service._slots.acquire(blocking=False)
        r = TestClient(app, base_url="http://127.0.0.1").post(
            "/v1/chatops", json={"question": QUESTION}, headers=ADMIN)
    finally:
        for _ in range(settings.agent_max_concurrent):
            service._slots.release()
    assert r.status_code == 429 and r.headers["retry-after"] == "5"


def _signed(body: str, secret: str = SECRET, ts: int | None = None) -> dict[str, str]:
    return signed(body, secret, ts)


@pytest.fixture
def receiver() -> Any:
    with response_receiver() as hook:
        yield hook


def test_slack_acks_within_3_s_and_posts_the_answer(server: RunningServer,
                                                    receiver: Any) -> None:
    url, got = receiver
    body = urlencode({"command": "/aiops", "text": QUESTION, "user_name": "bob",
                      "response_url": url})
    started = time.monotonic()
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=_signed(body))
    acked = time.monotonic() - started
    assert r.status_code == 200 and acked < 3.0
    assert r.json()["text"].startswith("Looking into:")
    follow_up = got.get(timeout=60)
    assert follow_up["response_type"] == "in_channel"
    incident = server.store.query("SELECT incident_id FROM incidents_current").rows[0][0]
    assert incident in follow_up["text"]


@pytest.mark.parametrize("headers", [
    _signed("other body"),  # a signature of something else
    _signed("x", secret="not-the-secret"),
    {"x-slack-request-timestamp": "1", "x-slack-signature": "v0=00"},
    {}])
def test_slack_refuses_a_bad_or_stale_signature(server: RunningServer,
                                                headers: dict[str, str]) -> None:
    body = urlencode({"text": QUESTION, "response_url": "http://127.0.0.1:9/hook"})
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    assert r.status_code == 401


def test_slack_posts_only_to_allowed_hosts(server: RunningServer) -> None:
    body = urlencode({"text": QUESTION, "response_url": "http://169.254.169.254/latest"})
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=_signed(body))
    assert r.status_code == 400 and "not allowed" in r.json()["error"]

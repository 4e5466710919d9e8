"""Slack's slash command under RBAC, on the real server: the Slack user id (never the display
name) maps to a role through ``slack_user_roles``; unmapped users may only ask; a signed
request is used once."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agents import chatops
from agents.chatops import AgentService, _Seen, make_router, slack_roles
from aiops.auth import Authenticator, Role
from aiops.bench.common import free_port
from aiops.config import Settings, load_settings
from aiops.errors import ConfigError
from aiops.remediation.policy import DEMO_POLICY
from aiops.server.guard import Guards
from aiops.store import Store
from tests.agents.scenario import slow_canary
from tests.agents.slack import response_receiver, signed
from tests.conftest import RunningServer

SECRET = "3c1f0e9a7b5d42e8a6f1c0b9d8e7f6a5"
TOKEN = "admin-token-for-slack-tests"
ADMIN_ID, OPERATOR_ID = "U0ADMIN01", "U0OPS0001"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Slack on, two mapped users, the demo policy (scaling waits for approval)."""
    s = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                      serve_port=free_port(), control_port=free_port(), scrape_targets="",
                      analytics=False, agent_llm_url="none", admin_token=TOKEN,
                      slack_signing_secret=SECRET, slack_response_hosts="127.0.0.1",
                      slack_user_roles=f"{ADMIN_ID}=admin, {OPERATOR_ID}=operator",
                      policy_file=DEMO_POLICY)
    s.data_dir.mkdir(parents=True)
    store = Store(s.db_path)
    slow_canary(store, time.time_ns())
    store.close()
    return s


@pytest.fixture
def receiver() -> Iterator[tuple[str, queue.Queue[dict[str, Any]]]]:
    with response_receiver() as hook:
        yield hook


def _signed(body: str, ts: int | None = None) -> dict[str, str]:
    return signed(body, SECRET, ts)


def _slack(server: RunningServer, receiver: Any, text: str, user_id: str,
           user_name: str = "someone") -> str:
    """Send a signed slash command; the text of the answer posted to response_url."""
    url, got = receiver
    body = urlencode({"command": "/aiops", "text": text, "user_id": user_id,
                      "user_name": user_name, "response_url": url})
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=_signed(body))
    assert r.status_code == 200, r.text
    return str(got.get(timeout=60)["text"])


def _pending(server: RunningServer) -> str:
    """A scaling action waiting for approval, proposed by an admin over the JSON API."""
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "scale echo", "user": "ops"},
                   headers={"authorization": f"Bearer {TOKEN}"}, timeout=60)
    proposal = r.json()["proposal"]["data"]
    assert r.status_code == 200 and proposal["status"] == "pending", r.text
    return str(proposal["action_id"])


def _ledger(server: RunningServer) -> list[tuple[str, str, str]]:
    rows = server.store.query("SELECT actor, entry FROM ledger ORDER BY seq").rows
    return [(actor, json.loads(e)["action_id"], json.loads(e)["status"]) for actor, e in rows]


@pytest.mark.parametrize(("user_id", "user_name"), [
    ("U0NOBODY1", "carol"),
    ("U0NOBODY1", "admin"),  # renaming oneself 'admin' gains nothing
    ("U0NOBODY1", ADMIN_ID),  # nor does taking an admin's id as a display name
    ("", ADMIN_ID)])
def test_an_unmapped_slack_user_cannot_approve(server: RunningServer, receiver: Any,
                                               user_id: str, user_name: str) -> None:
    action = _pending(server)
    text = _slack(server, receiver, f"approve {action}", user_id, user_name)
    assert f"Could not approve {action}" in text and "needs the admin role" in text, text
    assert [s for _, a, s in _ledger(server) if a == action][-1] == "pending"


def test_a_mapped_slack_admin_approves(server: RunningServer, receiver: Any) -> None:
    action = _pending(server)
    text = _slack(server, receiver, f"approve {action}", ADMIN_ID, user_name="not-admin")
    assert text.startswith(action) and "Could not" not in text, text
    # Approved, then run: with no Serve control plane here, it fails, on record.
    assert (f"slack:{ADMIN_ID}", action, "approved") in _ledger(server)
    assert _ledger(server)[-1][1:] == (action, "failed")


def test_a_slack_operator_proposes_but_does_not_approve(server: RunningServer,
                                                        receiver: Any) -> None:
    text = _slack(server, receiver, "scale echo", OPERATOR_ID)
    proposed = [(actor, a) for actor, a, s in _ledger(server) if s == "proposed"]
    assert proposed and proposed[0][0] == f"slack:{OPERATOR_ID}", text
    action = proposed[0][1]
    text = _slack(server, receiver, f"approve {action}", OPERATOR_ID)
    assert "needs the admin role" in text
    assert [s for _, a, s in _ledger(server) if a == action][-1] == "pending"


def test_an_unmapped_slack_user_may_ask_but_not_propose(server: RunningServer,
                                                        receiver: Any) -> None:
    incident = server.store.query("SELECT incident_id FROM incidents_current").rows[0][0]
    assert incident in _slack(server, receiver, "What happened to echo?", "U0NOBODY1")
    text = _slack(server, receiver, "roll back echo", "U0NOBODY1", user_name="admin")
    assert "needs the operator role" in text
    assert server.store.count("actions") == 0 and _ledger(server) == []


def test_a_replayed_slack_request_is_refused(server: RunningServer, receiver: Any) -> None:
    url, got = receiver
    body = urlencode({"text": "help", "user_id": ADMIN_ID, "response_url": url})
    headers = _signed(body)
    first = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    assert first.status_code == 200, first.text
    got.get(timeout=60)
    again = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    assert again.status_code == 401 and again.json()["error"] == "replayed request"
    # The same words signed anew: a timestamp other than the first's (int(time.time()) - 1
    # could be the first's own second when the answer came back within a second).
    fresh = _signed(body, ts=int(headers["x-slack-request-timestamp"]) - 1)
    assert httpx.post(f"{server.url}/v1/slack/command", content=body,
                      headers=fresh).status_code == 200


def test_remembered_signatures_expire_and_are_bounded() -> None:
    now = [1_000_000.0]
    seen = _Seen(window_s=300, cap=2, clock=lambda: now[0])
    assert seen.use("v0=a", 1_000_000) is None
    assert seen.use("v0=a", 1_000_000) == 0  # a replay
    assert seen.use("v0=b", 999_900) is None
    wait = seen.use("v0=c", 1_000_000)  # full: refused, not forgotten
    assert wait is not None and 0 < wait <= 201
    assert seen.use("v0=a", 1_000_000) == 0
    now[0] += 202  # b's timestamp has left the window: room again
    assert seen.use("v0=c", 1_000_000) is None
    assert seen.use("v0=a", 1_000_000) == 0
    now[0] += 100  # a's too: Slack's verifier refuses it now anyway
    assert seen.use("v0=d", 1_000_300) is None


def test_a_full_replay_memory_refuses_with_503(settings: Settings, store: Store,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chatops, "SLACK_SEEN_MAX", 1)
    app = FastAPI()
    app.include_router(make_router(AgentService(settings, store),
                                   Guards(Authenticator.from_settings(settings))))
    client = TestClient(app)
    body = urlencode({"text": "help", "response_url": "http://127.0.0.1:9/hook"})
    assert client.post("/v1/slack/command", content=body,
                       headers=_signed(body)).status_code == 200
    r = client.post("/v1/slack/command", content=body,
                    headers=_signed(body, ts=int(time.time()) - 2))
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1


def test_slack_user_roles_are_parsed_by_user_id() -> None:
    assert slack_roles(" U0ADMIN01=admin ,W0OPS=Operator,,U0V=viewer") == {
        "U0ADMIN01": Role.ADMIN, "W0OPS": Role.OPERATOR, "U0V": Role.VIEWER}
    assert slack_roles("") == {}


@pytest.mark.parametrize("spec", ["U0ADMIN01", "U0ADMIN01=root", "alice=admin",
                                  "u0admin01=admin", "U0A=admin,U0A=viewer", "=admin"])
def test_a_malformed_slack_user_roles_fails_at_start(settings: Settings, store: Store,
                                                     spec: str) -> None:
    bad = settings.model_copy(update={"slack_user_roles": spec})
    with pytest.raises(ConfigError, match="AIOPS_SLACK_USER_ROLES"):
        make_router(AgentService(bad, store), Guards(Authenticator.from_settings(bad)))

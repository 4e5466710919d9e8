"""Slack's slash command under RBAC, on the real server: the Slack user id (never the display
name) maps to a role through ``slack_user_roles``; unmapped users may only ask; a signed
request is used once, a restart of the server included; whatever a request holds, the
answer is a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import queue
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message

from agents import chatops
from agents.chatops import SLACK_MAX_BODY, AgentService, _Seen, make_router, slack_roles
from agents.settings import AgentSettings, SlackSettings
from agents.slack_replay import SEEN_FILE, SeenSignatures
from aiops.auth import Authenticator, Role
from aiops.config import Settings, load_settings
from aiops.errors import ConfigError
from aiops.remediation.policy import DEMO_POLICY
from aiops.server.app import create_app
from aiops.server.guard import Guards
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.agents.scenario import slow_canary
from tests.agents.slack import response_receiver, signed
from tests.conftest import RunningServer
from tests.loopback import serving

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
    app.include_router(make_router(_service(settings, store),
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
        make_router(_service(bad, store),
                    Guards(Authenticator.from_settings(bad)))


# Replays across a restart (security issue, item 10): the signatures used are on disk.


def _service(settings: Settings, store: Store) -> AgentService:
    """The agent service as the server wires it: its own settings and Slack's."""
    return AgentService(AgentSettings.of(settings), store, slack=SlackSettings.of(settings))


def _router_app(settings: Settings, store: Store) -> FastAPI:
    app = FastAPI()
    app.include_router(make_router(_service(settings, store),
                                   Guards(Authenticator.from_settings(settings))))
    return app


def test_a_request_replayed_after_a_restart_is_refused(settings: Settings,
                                                       receiver: Any) -> None:
    url, got = receiver
    body = urlencode({"text": "help", "user_id": ADMIN_ID, "response_url": url})
    headers = _signed(body)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store)) as base:
            first = httpx.post(f"{base}/v1/slack/command", content=body, headers=headers)
            assert first.status_code == 200, first.text
            got.get(timeout=60)
    finally:
        store.close()
    record = settings.data_dir / SEEN_FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert headers["x-slack-signature"] in record.read_text()
    store = Store(settings.db_path)  # the server again, a new app, the same data dir
    try:
        with serving(create_app(settings, store)) as base:
            again = httpx.post(f"{base}/v1/slack/command", content=body, headers=headers)
            assert again.status_code == 401 and again.json()["error"] == "replayed request"
            fresh = _signed(body, ts=int(headers["x-slack-request-timestamp"]) - 1)
            assert httpx.post(f"{base}/v1/slack/command", content=body,
                              headers=fresh).status_code == 200
    finally:
        store.close()


def test_the_replay_record_is_pruned_bounded_and_survives_a_torn_line(tmp_path: Path
                                                                      ) -> None:
    now = [1_000_000.0]
    path = tmp_path / "data" / SEEN_FILE  # its folder is made when first needed
    seen = SeenSignatures(300, cap=3, clock=lambda: now[0], path=path)
    assert seen.use("v0=a", 1_000_000) is None and seen.use("v0=b", 999_800) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # A restart: both still refused; a line a crash cut short is dropped, not merged.
    with path.open("a") as f:
        f.write("1000301 v0=tor")
    again = SeenSignatures(300, cap=3, clock=lambda: now[0], path=path)
    assert again.use("v0=a", 1_000_000) == 0 and again.use("v0=b", 999_800) == 0
    assert again.use("v0=c", 1_000_000) is None
    assert again.use("v0=d", 1_000_000) is not None  # full: waits, forgets nothing early
    # b's timestamp leaves the window: forgotten in memory, and on disk at the next start.
    now[0] += 102
    assert again.use("v0=tor", 1_000_000) is None  # the torn line was never a request
    assert again.use("v0=d", 1_000_000) is not None  # full again: a, c, tor
    later = SeenSignatures(300, cap=3, clock=lambda: now[0], path=path)
    assert "v0=b" not in path.read_text() and len(later) == 3
    # Many uses over a long time: the file stays about the size of what is live.
    for i in range(500):
        now[0] += 400
        assert later.use(f"v0=n{i}", int(now[0])) is None
    assert len(path.read_text().splitlines()) <= 2 * 1 + 64
    assert [p.name for p in path.parent.iterdir()] == [SEEN_FILE]  # no temporary left
    with pytest.raises(ValueError):
        later.use("v0=a b", int(now[0]))  # one token a line


def test_a_replay_record_that_cannot_be_written_refuses_the_request(
        settings: Settings, store: Store) -> None:
    record = settings.data_dir / SEEN_FILE
    client = TestClient(_router_app(settings, store))
    record.mkdir()  # in the way: no line can be appended, whoever the server runs as
    body = urlencode({"text": "help", "response_url": "http://127.0.0.1:9/hook"})
    r = client.post("/v1/slack/command", content=body, headers=_signed(body))
    assert r.status_code == 503 and "cannot record" in r.json()["error"]
    with pytest.raises(ConfigError, match="Slack replay record"):
        _router_app(settings, store)  # nor read at start: the server does not start


# Odd input gets a 4xx, never a 500 (security issue, item 10).


def _signed_bytes(body: bytes, ts: int | None = None) -> dict[str, str]:
    ts = ts or int(time.time())
    mac = hmac.new(SECRET.encode(), b"v0:" + str(ts).encode() + b":" + body, hashlib.sha256)
    return {"x-slack-request-timestamp": str(ts), "x-slack-signature": f"v0={mac.hexdigest()}",
            "content-type": "application/x-www-form-urlencoded"}


def _latin1(headers: dict[str, str]) -> dict[bytes, bytes]:
    """Headers as bytes, so that a test may send what httpx would not encode itself."""
    return {k.encode("latin-1"): v.encode("latin-1") for k, v in headers.items()}


@pytest.mark.parametrize("stamp", [
    "9" * 5000, "1" * 13, "\u00b2", "1e9", "-1", "+1",
    "1.5", "0", str(int(time.time()) - 301), str(int(time.time()) + 10_000), ""])
def test_an_odd_timestamp_is_401_not_500(server: RunningServer, stamp: str) -> None:
    body = urlencode({"text": "help", "response_url": "http://127.0.0.1:9/hook"})
    headers = _latin1({**_signed(body), "x-slack-request-timestamp": stamp})
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    assert r.status_code == 401, r.text
    assert "timestamp" in r.json()["error"].lower(), r.text


@pytest.mark.parametrize("signature", ["v0=\u00e9", "v0=" + "0" * 5000, "v0=" + "A" * 64,
                                       "v1=" + "0" * 64])
def test_an_odd_signature_is_401_not_500(server: RunningServer, signature: str) -> None:
    body = urlencode({"text": "help", "response_url": "http://127.0.0.1:9/hook"})
    headers = _latin1({**_signed(body), "x-slack-signature": signature})
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    assert r.status_code == 401 and "signature" in r.json()["error"], r.text


@pytest.mark.parametrize("signed_right", [True, False])
def test_a_body_that_is_not_utf8_is_4xx_not_500(server: RunningServer,
                                                signed_right: bool) -> None:
    body = b"text=\xff\xfe&response_url=http%3A%2F%2F127.0.0.1%3A9%2Fhook"
    headers = _signed_bytes(body) if signed_right else _signed_bytes(b"text=other")
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=headers)
    if signed_right:
        assert r.status_code == 400 and r.json()["error"] == "body is not UTF-8 form data"
    else:
        assert r.status_code == 401 and "signature" in r.json()["error"], r.text


@pytest.mark.parametrize(("body", "error"), [
    ("&".join(f"f{i}=1" for i in range(1000)), "form fields"),
    (urlencode({"text": "help", "response_url": "http://[::1/hook"}), "not allowed"),
    (urlencode({"text": "help", "response_url": "http://127.0.0.1:99999/hook"}), None),
    ("%", "not allowed")])
def test_odd_form_data_is_4xx_not_500(server: RunningServer, body: str,
                                      error: str | None) -> None:
    r = httpx.post(f"{server.url}/v1/slack/command", content=body, headers=_signed(body))
    assert r.status_code in (200, 400), r.text  # a bad port fails the follow-up, not this
    if error is not None:
        assert r.status_code == 400 and error in r.json()["error"], r.text


def test_a_huge_body_is_refused_as_it_streams_not_read_whole(settings: Settings,
                                                             store: Store) -> None:
    """The route itself stops reading at its cap (whatever is in front of it): a 200 MiB
    body in 4 KiB chunks, with no Content-Length, is refused after three of them."""
    app = _router_app(settings, store)
    chunk, total = b"x" * 4096, 200 * 2**20
    pulled, sent = [0], []

    async def receive() -> Message:
        pulled[0] += 1
        if pulled[0] > 64:  # the route went on reading past its cap
            raise AssertionError(f"read {pulled[0] * len(chunk)} bytes of the body")
        more = pulled[0] * len(chunk) < total
        return {"type": "http.request", "body": chunk, "more_body": more}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [(k.encode(), v.encode()) for k, v in _signed("x").items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/slack/command",
             "raw_path": b"/v1/slack/command", "query_string": b"", "root_path": "",
             "headers": [*headers, (b"transfer-encoding", b"chunked")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert pulled[0] <= SLACK_MAX_BODY // len(chunk) + 1
    assert b"over 8 KiB" in b"".join(m.get("body", b"") for m in sent[1:])


def test_a_huge_declared_body_is_refused_before_it_arrives(server: RunningServer) -> None:
    """On the server: 200 MiB announced, 16 KiB sent, and the 413 comes at once."""
    host, port = server.url.removeprefix("http://").split(":")
    headers = "".join(f"{k}: {v}\r\n" for k, v in _signed("x").items())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /v1/slack/command HTTP/1.1\r\nhost: {host}:{port}\r\n"
                     f"{headers}content-length: {200 * 2**20}\r\n\r\n".encode()
                     + b"x" * 16384)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

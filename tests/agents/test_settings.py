"""The agent's and Slack's own settings, read once from the server's: only their fields, with
the fallbacks the server's configuration documents; on a server that only attaches to others'
serving, no LLM the configuration does not name."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from agents.settings import AgentSettings, SlackSettings
from agents.slack_replay import SEEN_FILE
from aiops.attach.watch import save_managed
from aiops.client import ServerClient
from aiops.config import AttachTarget, Settings, load_settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.agents.scenario import slow_canary
from tests.loopback import serving


def test_the_agent_uses_the_serving_sides_first_api_key_when_it_has_none(tmp_path: Path
                                                                           ) -> None:
    s = Settings(data_dir=tmp_path, api_keys=" ,key-one,key-two", agent_mode="tools")
    a = AgentSettings.of(s)
    assert (a.llm_api_key, a.mode, a.llm_base) == ("key-one", "tools", f"{s.serve_url}/v1")
    own = AgentSettings.of(s.model_copy(update={"agent_llm_api_key": "agent-key"}))
    assert own.llm_api_key == "agent-key"
    assert AgentSettings.of(s.model_copy(update={"agent_llm_url": "none"})).llm_base is None


def test_slack_is_off_without_a_secret_and_keeps_no_replay_record(tmp_path: Path) -> None:
    off = SlackSettings.of(Settings(data_dir=tmp_path))
    assert off.signing_secret == "" and off.seen_file is None
    on = SlackSettings.of(Settings(data_dir=tmp_path, slack_signing_secret="s" * 32,
                                   slack_response_hosts=" Hooks.Slack.com ,,example.org"))
    assert on.seen_file == tmp_path / SEEN_FILE
    assert on.response_hosts == {"hooks.slack.com", "example.org"}


# -- an attach-only server's agent calls no LLM it was not given ------------------------------

TOKEN = "admin-t0ken-for-attach-only"
QUESTION = "What happened to echo in the last 15 minutes?"


def _team_app(seen: list[tuple[str, str]]) -> FastAPI:
    """The team's own app on the port `serve_url` names (their Serve proxy's :8000): it
    records every request and answers 200 with an empty object, as an app that is not an LLM
    might."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT"])
    async def anything(request: Request, path: str) -> dict[str, Any]:
        seen.append((request.method, f"/{path}"))
        return {}

    return app


@pytest.fixture
def team_app() -> Iterator[tuple[int, list[tuple[str, str]]]]:
    seen: list[tuple[str, str]] = []
    port = free_port()
    with serving(_team_app(seen), port):
        yield port, seen


def _ask(tmp_path: Path, serve_port: int, **overrides: Any) -> dict[str, Any]:
    """`aiops ask` (the CLI's client) against a real server with an incident in its store."""
    s = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                      serve_port=serve_port, control_port=free_port(), scrape_targets="",
                      analytics=False, admin_token=TOKEN, agent_llm_when_busy="ask",
                      attach_interval_s=60, **overrides)
    s.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(s.db_path)
    try:
        slow_canary(store, time.time_ns())
        with serving(create_app(s, store), s.server_port, s), ServerClient.of(s) as client:
            return client.ask(QUESTION)
    finally:
        store.close()


def _ray(port: int | None = None) -> AttachTarget:
    return AttachTarget(kind="ray", name="team-ray",
                        url=f"http://127.0.0.1:{port or free_port()}")


@pytest.mark.parametrize("how", ["configured", "added", "off"])
def test_an_attach_only_server_sends_no_prompt_to_the_teams_app(
        tmp_path: Path, team_app: tuple[int, list[tuple[str, str]]], how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    port, seen = team_app
    if how == "added":  # `aiops attach add` before the server starts
        save_managed(tmp_path / "data", [_ray()])
    overrides: dict[str, dict[str, Any]] = {
        "configured": {"attach": (_ray(),)}, "added": {}, "off": {"embedded_stack": "off"}}
    with caplog.at_level(logging.WARNING, logger="agents.settings"):
        answer = _ask(tmp_path, port, **overrides[how])
    assert seen == []  # not even a GET: nothing of aiops' went to the team's app
    assert answer["facts"]["component"] == "echo"  # the facts are there
    assert answer["narrative"]["source"] == "template"
    assert any("the agent has no LLM" in r.getMessage() for r in caplog.records)


def test_the_embedded_stacks_llm_is_asked(
        tmp_path: Path, team_app: tuple[int, list[tuple[str, str]]]) -> None:
    """The other side: where `aiops up` runs the stack beside the server (its Serve endpoint
    serves the agent's model), the agent asks it, attach targets or not; so the test above
    would see the prompt if one were sent."""
    port, seen = team_app
    answer = _ask(tmp_path, port, embedded_stack="on", attach=(_ray(),))
    assert ("POST", "/v1/chat/completions") in seen
    assert answer["narrative"]["source"] == "template"  # `{}` is no narrative
    assert "LLM" in (answer["narrative"]["rejected"] or "")


def test_a_named_llm_is_asked_on_an_attach_only_server(
        tmp_path: Path, team_app: tuple[int, list[tuple[str, str]]]) -> None:
    port, seen = team_app
    _ask(tmp_path, free_port(), attach=(_ray(),), agent_llm_url=f"http://127.0.0.1:{port}/v1")
    assert ("POST", "/v1/chat/completions") in seen

"""The agent's and Slack's own settings, read once from the server's: only their fields, with
the fallbacks the server's configuration documents."""

from __future__ import annotations

from pathlib import Path

from agents.settings import AgentSettings, SlackSettings
from agents.slack_replay import SEEN_FILE
from aiops.config import Settings


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

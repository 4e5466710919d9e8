"""The agent's own settings and the Slack endpoint's, read once from ``aiops.config.Settings``
by whoever wires the server: the agent sees these fields and no others (not the server's ports,
the store's limits or the collectors' intervals)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agents.slack_replay import SEEN_FILE
from aiops.config import Settings

__all__ = ["AgentSettings", "SlackSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    """How the agent answers: which LLM (none: templates only), how it may use it, and the
    bounds of its lookups (``AIOPS_AGENT_*``)."""

    mode: Literal["plan", "tools"] = "plan"
    llm_base: str | None = None  # OpenAI-compatible base URL; None: no LLM
    llm_model: str = "aiops-agent"
    llm_api_key: str = "none"
    timeout_s: float = 60.0
    when_busy: Literal["skip", "ask"] = "skip"
    priority: Literal["batch", "realtime", ""] = "batch"
    max_concurrent: int = 4
    sql_rows: int = 200
    sql_timeout_s: float = 5.0

    @classmethod
    def of(cls, s: Settings) -> AgentSettings:
        # Without a key of its own the agent uses the serving side's first API key.
        key = s.agent_llm_api_key or next(
            (k.strip() for k in s.api_keys.split(",") if k.strip()), "none")
        base = s.agent_llm_base
        if base is None and s.agent_llm_url.strip().lower() != "none":
            # Attach-only: serve_url is not aiops' stack (at best the team's own app), and
            # incident data goes to no endpoint that was not named as an LLM.
            why = "embedded_stack = off" if s.embedded_stack == "off" \
                else "attach targets are configured or added"
            log.warning("the agent has no LLM: this server only attaches (%s), so %s is not "
                        "the agent's model, and AIOPS_AGENT_LLM_URL names none; answers carry "
                        "the template's narrative", why, s.serve_url)
        return cls(mode=s.agent_mode, llm_base=base, llm_model=s.agent_llm_model,
                   llm_api_key=key, timeout_s=s.agent_timeout_s,
                   when_busy=s.agent_llm_when_busy, priority=s.agent_llm_priority,
                   max_concurrent=s.agent_max_concurrent, sql_rows=s.agent_sql_rows,
                   sql_timeout_s=s.agent_sql_timeout_s)


@dataclass(frozen=True)
class SlackSettings:
    """The Slack slash command (``AIOPS_SLACK_*``): off without a signing secret."""

    signing_secret: str = ""
    user_roles: str = ""  # ``U123=admin,...``, parsed (and refused) by chatops.slack_roles
    response_hosts: frozenset[str] = field(default_factory=frozenset)
    seen_file: Path | None = None  # the replay record; only when Slack is on

    @classmethod
    def of(cls, s: Settings) -> SlackSettings:
        return cls(signing_secret=s.slack_signing_secret, user_roles=s.slack_user_roles,
                   response_hosts=frozenset(h.strip().lower()
                                            for h in s.slack_response_hosts.split(",")
                                            if h.strip()),
                   seen_file=Path(s.data_dir) / SEEN_FILE if s.slack_signing_secret else None)

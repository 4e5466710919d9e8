"""The CLI's token, against the real server: ``AIOPS_TOKEN`` is what the CLI sends, never
swapped for the admin token it can read on disk (security issue, item 9). An operator's token
gets the server's 403 and a non-zero exit; the admin token still approves; with no
``AIOPS_TOKEN`` the admin token where this machine has it is used, as before."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from aiops.auth import ADMIN_TOKEN_FILE, Role, TokenStore, ensure_secret
from aiops.cli import app as cli_app
from aiops.client import ServerClient, client_token
from aiops.config import Settings, load_settings
from aiops.remediation.policy import DEMO_POLICY
from aiops.stack import settings_env
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.agents.scenario import slow_canary
from tests.conftest import RunningServer


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """As `aiops server` leaves it: no AIOPS_ADMIN_TOKEN, the admin token in its file; the
    demo policy (scaling waits for approval) and an incident to act on."""
    s = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                      serve_port=free_port(), control_port=free_port(), scrape_targets="",
                      analytics=False, agent_llm_url="none", policy_file=DEMO_POLICY)
    s.data_dir.mkdir(parents=True)
    ensure_secret(s.data_dir / ADMIN_TOKEN_FILE)
    store = Store(s.db_path)
    slow_canary(store, time.time_ns())
    store.close()
    return s


def _admin(settings: Settings) -> str:
    return (settings.data_dir / ADMIN_TOKEN_FILE).read_text().strip()


def _token(settings: Settings, name: str, role: Role) -> str:
    return TokenStore(settings.data_dir / "tokens.json").add(name, role)


def _pending(server: RunningServer) -> str:
    r = httpx.post(f"{server.url}/v1/chatops", json={"question": "scale echo", "user": "ops"},
                   headers={"authorization": f"Bearer {_admin(server.settings)}"}, timeout=60)
    assert r.status_code == 200, r.text
    proposal = r.json()["proposal"]["data"]
    assert proposal["status"] == "pending", r.text
    return str(proposal["action_id"])


def _ledger(server: RunningServer, action_id: str) -> list[tuple[str, str]]:
    rows = server.store.query("SELECT actor, entry FROM ledger ORDER BY seq").rows
    return [(actor, json.loads(e)["status"]) for actor, e in rows
            if json.loads(e)["action_id"] == action_id]


def _cli(settings: Settings, args: list[str], token: str | None) -> Result:
    env = settings_env(settings)
    env["AIOPS_TOKEN"] = token or ""
    return CliRunner().invoke(cli_app, args, env=env)


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_an_operator_aiops_token_is_refused_not_swapped_for_the_admin_token(
        server: RunningServer, verdict: str) -> None:
    action = _pending(server)
    operator = _token(server.settings, "sre", Role.OPERATOR)
    result = _cli(server.settings, ["actions", verdict, action], operator)
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "HTTP 403" in out and "needs the admin role" in out and "AIOPS_TOKEN" in out, out
    assert _ledger(server, action)[-1][1] == "pending"
    assert not any(actor.startswith("user:") for actor, _ in _ledger(server, action))


def test_an_unknown_aiops_token_is_refused(server: RunningServer) -> None:
    action = _pending(server)
    result = _cli(server.settings, ["actions", "approve", action],
                  "not-a-token-anyone-issued-0123456789")
    assert result.exit_code == 1 and "HTTP 401" in result.output, result.output
    assert _ledger(server, action)[-1][1] == "pending"


@pytest.mark.parametrize("via_env", [True, False])
def test_the_admin_token_approves_from_aiops_token_or_from_disk(
        server: RunningServer, via_env: bool) -> None:
    action = _pending(server)
    token = _admin(server.settings) if via_env else None
    result = _cli(server.settings, ["actions", "approve", action, "--user", "bob"], token)
    assert result.exit_code == 0 and action in result.output, result.output
    assert ("user:bob", "approved") in _ledger(server, action)


def test_aiops_ask_sends_aiops_token_not_the_admin_token(server: RunningServer) -> None:
    action = _pending(server)
    operator = _token(server.settings, "sre", Role.OPERATOR)
    result = _cli(server.settings, ["ask", "--json", f"approve {action}"], operator)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)  # stderr may carry log lines
    assert "needs the admin role" in answer["text"], answer["text"]
    assert _ledger(server, action)[-1][1] == "pending"
    viewer = _token(server.settings, "grafana", Role.VIEWER)
    result = _cli(server.settings, ["ask", "what happened to echo?"], viewer)
    out = " ".join(result.output.split())
    assert result.exit_code == 1 and "HTTP 403" in out and "AIOPS_TOKEN" in out, out


def test_models_rollout_sends_aiops_token_not_the_admin_token(server: RunningServer) -> None:
    operator = _token(server.settings, "sre", Role.OPERATOR)
    result = _cli(server.settings, ["models", "rollout", "echo", "v2", "--no-wait"], operator)
    out = " ".join(result.output.split())
    assert result.exit_code == 1 and "HTTP 403" in out and "needs the admin role" in out, out


def test_client_token_precedence(settings: Settings) -> None:
    on_disk = _admin(settings)
    assert client_token(settings) == on_disk
    mine = "operator-token-0123456789abcdef"
    assert client_token(settings.model_copy(update={"token": mine})) == mine
    configured = "configured-admin-0123456789abcd"
    assert client_token(settings.model_copy(update={"admin_token": configured})) == configured
    (settings.data_dir / ADMIN_TOKEN_FILE).unlink()
    assert client_token(settings) is None
    with ServerClient.of(settings) as client:  # says what it would have sent, not the token
        assert "no token" in client._token_source


def test_token_add_on_a_fresh_install_makes_a_private_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    result = CliRunner().invoke(cli_app, ["token", "add", "exporter"],
                                env={"AIOPS_DATA_DIR": str(data)})
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "tokens.json").stat().st_mode) == 0o600

"""The embedded stack for real (the session's `stack` fixture): traces into DuckDB, the CLI."""

from __future__ import annotations

import secrets
import time

import httpx
import pytest
from typer.testing import CliRunner

from aiops import stack as stack_mod
from aiops.cli import app
from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import StackError
from aiops_harness.demo import MODEL, chat, wait_for_trace

pytestmark = pytest.mark.stack


def _env(s: Settings) -> dict[str, str]:
    return stack_mod.settings_env(s)


@pytest.fixture(scope="module")
def running(stack: Settings) -> Settings:
    return stack


def test_a_traced_chat_request_lands_in_duckdb_as_spans_logs_and_metrics(
    running: Settings,
) -> None:
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    resp = chat(running.serve_url, "What is 2 + 2?", f"00-{trace_id}-{caller_span}-01",
                max_tokens=16)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]
    inference_id = resp.headers["x-inference-id"]
    # traceparent out: same trace, the ingress span as parent for whatever comes next.
    assert resp.headers["traceparent"].split("-")[1] == trace_id

    with ServerClient(running.server_url) as client:
        records = wait_for_trace(client, trace_id, timeout_s=60)
        assert records.complete, records
        by_service = {s["service_name"]: s for s in records.spans}
        ingress, model = by_service["ingress"], by_service[MODEL]
        assert ingress["kind"] == "server" and ingress["parent_span_id"] == caller_span
        assert resp.headers["traceparent"].split("-")[2] == ingress["span_id"]
        assert model["parent_span_id"] == ingress["span_id"]
        assert model["inference_id"] == ingress["inference_id"] == inference_id

        model_logs = [r for r in records.logs if r["span_id"] == model["span_id"]]
        assert model_logs and model_logs[0]["inference_id"] == inference_id

        assert {p["model"] for p in records.metric_points} >= {MODEL}
        labelled = client.rows(
            "SELECT DISTINCT name FROM metric_points "
            "WHERE (attributes->>'gen_ai.request.model') = ?", [MODEL])
        assert {"gen_ai.server.request.duration", "gen_ai.client.token.usage"} <= {
            r["name"] for r in labelled}

        # ... and one hash-chained provenance entry naming what answered.
        prov = client.rows("SELECT model, version, artifact_digest, input_hash, hardware, "
                           "inference_id FROM provenance WHERE trace_id = ?", [trace_id])
        assert len(prov) == 1 and prov[0]["model"] == MODEL and prov[0]["version"] == "v1"
        assert prov[0]["inference_id"] == inference_id
        assert all(prov[0][k].startswith("sha256:")
                   for k in ("artifact_digest", "input_hash", "hardware"))
        assert not client.rows("SELECT 1 FROM logs WHERE event_name = 'aiops.provenance'")


def test_ledger_verify_through_the_server(running: Settings) -> None:
    result = CliRunner().invoke(app, ["ledger", "verify"], env=_env(running))
    assert result.exit_code == 0 and "chain intact" in result.output, result.output


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
])
def test_invalid_chat_requests_get_openai_style_errors_with_trace_headers(
    running: Settings, body: dict[str, object], status: int, param: str,
) -> None:
    resp = httpx.post(f"{running.serve_url}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["param"] == param and error["message"]
    assert resp.headers["x-inference-id"] and resp.headers["traceparent"]


def test_a_body_that_is_not_json_gets_400(running: Settings) -> None:
    resp = httpx.post(f"{running.serve_url}/v1/chat/completions", content=b"{oops",
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["error"]["message"]


def test_status_and_sql_commands(running: Settings) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["status"], env=_env(running))
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["sql", "--json", "SELECT count(*) AS n FROM spans"],
                           env=_env(running))
    assert result.exit_code == 0 and '"columns": ["n"]' in result.output
    result = runner.invoke(app, ["sql", "DROP TABLE spans"], env=_env(running))
    assert result.exit_code == 1 and "only SELECT" in result.output


def test_a_second_up_is_refused_while_running(running: Settings) -> None:
    with pytest.raises(StackError, match="already running"):
        stack_mod.up(running)


def test_the_server_keeps_ingesting_after_the_model_answers(running: Settings) -> None:
    # Serve replicas export every second; metric points keep arriving while the stack is up.
    with ServerClient(running.server_url) as client:
        before = client.rows("SELECT count(*) AS n FROM metric_points")[0]["n"]
        time.sleep(2.5)
        after = client.rows("SELECT count(*) AS n FROM metric_points")[0]["n"]
    assert after > before


def test_ray_and_serve_metrics_are_scraped_into_duckdb(running: Settings) -> None:
    with ServerClient(running.server_url) as client:
        deadline = time.monotonic() + 40
        names: set[str] = set()
        while time.monotonic() < deadline and not any(n.startswith("ray_serve_") for n in names):
            names = {r["name"] for r in client.rows(
                "SELECT DISTINCT name FROM metric_points WHERE service_name = 'ray'")}
            time.sleep(1)
        up = client.rows("SELECT max(value) AS up FROM metric_points WHERE name = 'up' "
                         "AND service_name = 'ray'")
    assert any(n.startswith("ray_serve_") for n in names), sorted(names)[:20]
    assert up[0]["up"] == 1.0

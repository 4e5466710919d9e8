"""Progressive canaries on the real stack (analytics off, so only the rollout's own gate
acts): a healthy version goes 5 -> 25 -> 50 -> 100% and is promoted; a slow one is stopped
at its first step and rolled back under the policy. Every step is in the ledger. And load
shedding: batch requests refused until it is lifted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.lifecycle import LifecycleClient, admin_token
from aiops.remediation.actions import ActionKind, execute, new_action
from collectors.ebpf.attribution import REPLICAS_FILE
from serve.specs import load_specs
from tests.conftest import running_stack

pytestmark = pytest.mark.stack

MODELS = Path(__file__).resolve().parents[2] / "models-analytics.yaml"
POLICY = {"default_mode": "dry_run", "verify_s": 30,
          "rules": [{"id": "auto-rollback", "action": "rollback", "target": "*",
                     "mode": "auto"}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("rollout")
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    with running_stack(tmp / "data", MODELS, analytics=False, policy_file=policy,
                       ebpf="off") as s:
        stop = threading.Event()

        def run() -> None:
            with httpx.Client(base_url=s.serve_url, timeout=30) as c:
                while not stop.is_set():
                    c.post("/v1/chat/completions", json={
                        "model": "echo", "messages": [{"role": "user", "content": "ping"}]})
                    time.sleep(0.01)

        clients = [threading.Thread(target=run) for _ in range(2)]
        for t in clients:
            t.start()
        yield s
        stop.set()
        for t in clients:
            t.join()


def _apply(stack: Settings, tmp: Path, versions: list[str]) -> None:
    doc = yaml.safe_load(MODELS.read_text())
    base = doc["models"][0]
    doc["models"] = [{**base, "version": v, "traffic": 100 if i == 0 else 0}
                     for i, v in enumerate(versions)]
    (tmp / "models.yaml").write_text(yaml.safe_dump(doc))
    with LifecycleClient.from_settings(stack) as control:
        control.apply([s.model_dump(mode="json") for s in load_specs(tmp / "models.yaml")])


def _rollout(stack: Settings, version: str) -> dict[str, Any]:
    with ServerClient(stack.server_url) as db:
        # 6 s steps (up to 18 s when a step has too few requests): on a busy CI machine a
        # 5% step of 4 s saw too few canary requests to judge.
        state = db.rollout("echo", version, admin_token(stack), [5, 25, 50, 100], 6)
        deadline = time.monotonic() + 120
        while state["status"] in ("pending", "running") and time.monotonic() < deadline:
            time.sleep(1)
            state = db.rollouts(state["rollout_id"])
    return state


def _ledger(stack: Settings, rollout_id: str) -> list[dict[str, Any]]:
    with ServerClient(stack.server_url) as db:
        return db.rows("SELECT actor, (entry->>'status') AS status, entry->'outcome' AS outcome "
                       "FROM ledger WHERE action_id = ? ORDER BY seq", [rollout_id])


def test_a_rollout_wants_the_admin_token_and_valid_steps(stack: Settings) -> None:
    url = f"{stack.server_url}/api/v1/rollouts"
    assert httpx.post(url, json={"model": "echo", "version": "v2"}).status_code == 401
    bad = httpx.post(url, json={"model": "echo", "version": "v2", "steps": [50, 25]},
                     headers={"authorization": f"Bearer {admin_token(stack)}"})
    assert bad.status_code == 400 and "rise strictly" in bad.json()["error"]


def test_a_healthy_version_is_rolled_out_step_by_step_and_promoted(
        stack: Settings, tmp_path: Path) -> None:
    _apply(stack, tmp_path, ["v1", "v2"])
    state = _rollout(stack, "v2")
    assert state["status"] == "promoted", (state["history"],
                                           _ledger(stack, state["rollout_id"]))
    assert [h["percent"] for h in state["history"]] == [5, 25, 50]
    assert all(h["ok"] for h in state["history"])
    with LifecycleClient.from_settings(stack) as control:
        echo = control.status().models["echo"]
    assert echo.stable == "v2"
    entries = _ledger(stack, state["rollout_id"])
    assert [e["status"] for e in entries] == ["step", "step", "step", "promoted"]
    assert {e["actor"] for e in entries} == {"rollout"}


def test_a_slow_version_is_stopped_at_its_first_step_and_rolled_back(
        stack: Settings, tmp_path: Path) -> None:
    _apply(stack, tmp_path, ["v2", "v3"])  # v2 is stable now
    with LifecycleClient.from_settings(stack) as control:
        control.set_faults("echo", "v3", {"latency_ms": 150})
        state = _rollout(stack, "v3")
        weights = {v.version: v.weight for v in control.status().models["echo"].versions}
    assert state["status"] == "rolled_back", (state["history"],
                                              _ledger(stack, state["rollout_id"]))
    assert state["history"] == [{"percent": 5, "ok": False,
                                 "reason": state["history"][0]["reason"]}]
    assert state["history"][0]["reason"].startswith("latency")
    assert weights == {"v2": 100, "v3": 0}
    entries = _ledger(stack, state["rollout_id"])
    assert [e["status"] for e in entries] == ["step", "rolled_back"]
    outcome = entries[-1]["outcome"]
    action_id = (json.loads(outcome) if isinstance(outcome, str) else outcome)["action_id"]
    with ServerClient(stack.server_url) as db:
        statuses = [r["status"] for r in db.rows(
            "SELECT (entry->>'status') AS status FROM ledger WHERE action_id = ? ORDER BY seq",
            [action_id])]
    assert statuses[:3] == ["proposed", "approved", "executed"]



def test_shedding_refuses_batch_requests_until_lifted(stack: Settings) -> None:
    def ask(priority: str) -> httpx.Response:
        return httpx.post(f"{stack.serve_url}/v1/chat/completions", timeout=30,
                          headers={"x-aiops-priority": priority}, json={
                              "model": "echo", "messages": [{"role": "user", "content": "hi"}]})

    action = new_action(None, ActionKind.SHED_LOAD, "echo", None, time.time_ns(),
                        classes=["batch"])
    with LifecycleClient.from_settings(stack) as control:
        state = execute(control, action)
        try:
            assert {tuple(v["shed"]) for v in state["versions"]} == {("batch",)}
            refused = ask("batch")
            assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
            assert "shedding batch load" in refused.json()["error"]["message"]
            assert ask("realtime").status_code == 200
        finally:
            control.shed("echo", [])
    assert ask("batch").status_code == 200


def test_a_replica_restart_replaces_it_while_requests_are_served(stack: Settings) -> None:
    with LifecycleClient.from_settings(stack) as control:
        stable = control.status().models["echo"].stable
        action = new_action(None, ActionKind.RESTART_REPLICA, "echo", stable,
                            time.time_ns())
        old = execute(control, action)["restarted"]
    replicas = stack.data_dir / REPLICAS_FILE
    deadline = time.monotonic() + 90
    fresh: list[str] = []
    while time.monotonic() < deadline and not fresh:
        time.sleep(1)
        rows = json.loads(replicas.read_text()) if replicas.exists() else []
        fresh = [r["replica"] for r in rows
                 if r["model"] == "echo" and r["version"] == stable and r["replica"] != old]
    assert fresh, f"no new replica of echo {stable} replaced {old}"
    r = httpx.post(f"{stack.serve_url}/v1/chat/completions", timeout=30, json={
        "model": "echo", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200

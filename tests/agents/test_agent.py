"""The agent answers from the deterministic plan; telemetry text never steers it; with a
tool-calling model, llama-index's FunctionAgent drives the same tools."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.agent import Agent, make_llm
from agents.tools import Toolbox
from aiops.config import load_settings
from aiops.lifecycle import LifecycleClient
from aiops.remediation.policy import DEMO_POLICY, load_policy
from aiops.remediation.remediator import Remediator
from aiops.store import Store
from tests.agents.openai_script import scripted_app
from tests.agents.scenario import INJECTION, slow_canary
from tests.aiops.analytics.telemetry import NS, T0, traffic
from tests.loopback import serving


def test_what_happened_cites_the_incident_and_a_trace(store: Store) -> None:
    slow_canary(store)
    answer = Agent(Toolbox(store, now=lambda: T0)).ask(
        "What happened to echo in the last 15 minutes?")
    f = answer.facts
    assert f is not None and (f.component, f.version, f.fault_class) == ("echo", "v2",
                                                                          "latency")
    traces = [e.id for e in answer.evidence if e.kind == "trace"]
    assert traces and f.incident_id in answer.text and traces[0] in answer.text
    assert answer.narrative.source == "template" and f.incident_id in answer.narrative.cited


def test_no_incident_is_said_plainly_with_the_slis(store: Store) -> None:
    traffic(store, T0 - 120 * NS, 120, 2, 50)
    answer = Agent(Toolbox(store, now=lambda: T0)).ask("what happened to echo?")
    assert answer.facts is None and answer.narrative.text.startswith("No incident on echo")
    assert "did not run slow" in answer.narrative.text  # what its requests show
    assert "p95" in answer.text and answer.slis


def test_logs_that_give_orders_cause_no_action_and_no_policy_change(
        store: Store, tmp_path: Path) -> None:
    """The demo policy rolls back on its own: if the agent obeyed the logs, it would act."""
    slow_canary(store)
    policy_bytes = DEMO_POLICY.read_bytes()
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = Remediator(store, load_policy(DEMO_POLICY),
                            lambda: LifecycleClient.from_settings(settings))
    answer = Agent(Toolbox(store, remediator, now=lambda: T0)).ask(
        "What happened to echo in the last 15 minutes? Check its logs.")
    assert any(INJECTION in str(log["message"]) for log in answer.logs)  # it read them
    assert answer.proposal is None and store.count("actions") == 0
    assert store.count("ledger") == 0
    assert hashlib.sha256(DEMO_POLICY.read_bytes()).digest() == \
        hashlib.sha256(policy_bytes).digest()


@pytest.fixture
def scripted_model() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    with serving(scripted_app(seen)) as url:
        yield f"{url}/v1", seen


def test_a_tool_calling_model_drives_the_same_tools(
        store: Store, scripted_model: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = scripted_model
    slow_canary(store)
    llm = make_llm(url, "scripted", function_calling=True)
    answer = Agent(Toolbox(store, now=lambda: T0), llm, mode="tools").ask(
        "What happened to echo in the last 15 minutes?")
    assert answer.narrative.source == "agent", answer.narrative.rejected
    assert answer.facts is not None and answer.facts.incident_id in answer.narrative.text
    assert answer.facts.incident_id in answer.narrative.cited
    offered = {t["function"]["name"] for t in seen[0]["tools"]}
    assert {"list_incidents", "rca_evidence", "run_sql", "propose_action"} <= offered
    assert any(s.tool == "list_incidents" for s in answer.steps)
    # The agent's calls ask for the batch class: at the ingress they wait behind users.
    assert {s["x-aiops-priority"] for s in seen} == {"batch"}


def _policy(mode: str) -> Any:
    from aiops.remediation.policy import Policy

    return Policy.model_validate({"rules": [
        {"id": "chat-rollback", "action": "rollback", "target": "*", "mode": mode}]})


def test_an_impossible_rollback_is_refused_with_the_reason_and_nothing_is_ledgered(
        store: Store, tmp_path: Path) -> None:
    traffic(store, T0 - 120 * NS, 120, 2, 50)  # only v1 serves
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = Remediator(store, _policy("auto"),
                            lambda: LifecycleClient.from_settings(settings))
    answer = Agent(Toolbox(store, remediator, now=lambda: T0)).ask("roll back echo")
    assert answer.proposal is not None and not answer.proposal.ok
    assert "Not done: cannot roll back echo: only v1 has served it" in answer.text
    assert store.count("actions") == 0 and store.count("ledger") == 0


@pytest.mark.parametrize(("mode", "said"), [
    ("off", "Not done: the policy denied roll echo back from v2"),
    ("dry_run", "Dry run only: roll echo back from v2"),
    ("approve", "Waiting for approval: roll echo back from v2")])
def test_a_proposal_says_what_the_policy_did_with_it(
        store: Store, tmp_path: Path, mode: str, said: str) -> None:
    slow_canary(store)
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = Remediator(store, _policy(mode),
                            lambda: LifecycleClient.from_settings(settings))
    answer = Agent(Toolbox(store, remediator, now=lambda: T0)).ask("roll back echo")
    assert said in answer.text
    assert "-> ok" not in answer.text
    if mode == "approve":
        action_id = answer.proposal.data["action_id"] if answer.proposal else None
        assert f"'approve {action_id}'" in answer.text


def test_while_users_are_served_the_llm_is_not_asked_for_a_narrative(
        store: Store, scripted_model: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = scripted_model
    slow_canary(store)  # requests until T0: the models are serving
    llm = make_llm(url, "scripted")
    answer = Agent(Toolbox(store, now=lambda: T0), llm, when_busy="skip").ask(
        "What happened to echo in the last 15 minutes?")
    assert seen == [] and answer.narrative.source == "template"
    assert answer.narrative.rejected is not None
    assert answer.narrative.rejected.startswith("the LLM was not asked: ")
    assert answer.facts is not None  # the facts never needed it
    # A minute after the last request, it is asked.
    later = Agent(Toolbox(store, now=lambda: T0 + 60 * NS), llm, when_busy="skip").ask(
        "What happened to echo in the last 15 minutes?")
    assert len(seen) == 1 and later.facts is not None


def _scale_policy() -> Any:
    from aiops.remediation.policy import Policy

    return Policy.model_validate({"rules": [
        {"id": "chat-scale", "action": "scale", "target": "*", "mode": "dry_run",
         "max_replicas": 8}]})


@pytest.mark.parametrize(("question", "replicas"), [
    ("scale echo to 3 replicas", 3), ("please scale echo to 5", 5), ("scale echo", 2)])
def test_a_replica_count_in_the_request_is_the_one_proposed(
        store: Store, tmp_path: Path, question: str, replicas: int) -> None:
    traffic(store, T0 - 120 * NS, 120, 2, 50)  # echo v1 on one replica
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = Remediator(store, _scale_policy(),
                            lambda: LifecycleClient.from_settings(settings))
    answer = Agent(Toolbox(store, remediator, now=lambda: T0)).ask(question)
    assert answer.proposal is not None and answer.proposal.ok, answer.text
    assert answer.proposal.data["params"] == {"min_replicas": replicas,
                                              "max_replicas": replicas}
    assert f"{replicas} replica" in answer.text, answer.text


@pytest.mark.parametrize(("question", "why"), [
    ("scale echo to 1 replica", "echo already runs 1 replica"),
    ("scale echo to 0 replicas", "cannot scale echo to 0 replicas")])
def test_a_replica_count_that_changes_nothing_is_refused_with_the_reason(
        store: Store, tmp_path: Path, question: str, why: str) -> None:
    traffic(store, T0 - 120 * NS, 120, 2, 50)
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = Remediator(store, _scale_policy(),
                            lambda: LifecycleClient.from_settings(settings))
    answer = Agent(Toolbox(store, remediator, now=lambda: T0)).ask(question)
    assert answer.proposal is not None and not answer.proposal.ok
    assert f"Not done: {why}" in answer.text, answer.text
    assert store.count("actions") == 0

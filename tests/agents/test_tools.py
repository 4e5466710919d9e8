"""The agent's tools: structured results, guarded SQL, and acting only through the policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.tools import RECENT_TRACE_S, Limits, Toolbox, ToolStatus
from aiops.config import Settings, load_settings
from aiops.lifecycle import LifecycleClient
from aiops.remediation.policy import Policy
from aiops.remediation.remediator import Remediator
from aiops.store import Store
from tests.agents.scenario import slow_canary
from tests.aiops.analytics.telemetry import NS, T0, add_spans, span


@pytest.fixture
def box(store: Store) -> Toolbox:
    slow_canary(store)
    return Toolbox(store, now=lambda: T0)


def test_incidents_are_listed_and_described_with_their_evidence(box: Toolbox) -> None:
    listed = box.call("list_incidents", minutes=15)
    assert listed.ok and [i["service"] for i in listed.data] == ["echo"]
    inc = listed.data[0]
    assert (inc["model_version"], inc["fault_class"]) == ("v2", "latency")
    evidence = box.call("rca_evidence", incident_id=inc["incident_id"])
    assert evidence.ok and evidence.data["cause"]["entity"] == "echo@v2"
    trace = next(e["id"] for e in evidence.data["evidence"] if e["kind"] == "trace")
    spans = box.call("trace_lookup", trace_id=trace)
    assert spans.ok and spans.data[0]["service_name"] == "echo"


def test_a_trace_comes_back_whole_whether_recent_or_old(store: Store) -> None:
    box = Toolbox(store, now=lambda: T0)
    recent, crossing, old = "a" * 32, "b" * 32, "c" * 32
    hour = RECENT_TRACE_S * NS
    rows = [span(T0 - 60 * NS, 50), span(T0 - 60 * NS, 52, service="ingress"),
            # its root started before the hour, a child ended inside it
            span(T0 - hour - 60 * NS, 50), span(T0 - hour - 120 * NS, 200_000,
                                                 service="ingress"),
            span(T0 - 5 * hour, 50), span(T0 - 5 * hour, 52, service="ingress")]
    for r, tid in zip(rows, [recent, recent, crossing, crossing, old, old], strict=True):
        r["trace_id"] = tid
    for child, root in ((rows[0], rows[1]), (rows[2], rows[3]), (rows[4], rows[5])):
        child["parent_span_id"] = root["span_id"]
    add_spans(store, rows)
    for tid in (recent, crossing, old):
        found = box.call("trace_lookup", trace_id=tid)
        assert found.ok and sorted(r["service_name"] for r in found.data) == ["echo",
                                                                              "ingress"]


def test_bad_parameters_are_errors_the_caller_can_read(box: Toolbox) -> None:
    assert box.call("describe_incident", incident_id="inc-nope").error == \
        "no incident 'inc-nope'"
    assert box.call("trace_lookup", trace_id="xyz").error == "a trace id is 32 hex digits"
    assert box.call("list_incidents", minutes=-1).status is ToolStatus.ERROR
    assert "bad parameters" in (box.call("metric_lookup", modle="echo").error or "")
    assert "no tool" in (box.call("rm_rf").error or "")


def test_sql_is_read_only_row_limited_and_time_limited(store: Store) -> None:
    box = Toolbox(store, limits=Limits(sql_rows=5, sql_timeout_s=0.3))
    assert "only SELECT" in (box.call("run_sql", sql="DELETE FROM spans").error or "")
    assert "exactly one statement" in (
        box.call("run_sql", sql="SELECT 1; DROP TABLE spans").error or "")
    rows = box.call("run_sql", sql="SELECT * FROM range(100)")
    assert rows.ok and len(rows.data["rows"]) == 5 and rows.data["truncated"]
    slow = box.call("run_sql", sql="SELECT count(*) FROM range(100000000000)")
    assert slow.status is ToolStatus.ERROR and "interrupted" in (slow.error or "")


def test_telemetry_text_comes_back_labelled_as_data(box: Toolbox) -> None:
    logs = box.call("log_lookup", model="echo", minutes=15)
    assert logs.ok and logs.data
    assert set(logs.data[0]["message"]) == {"telemetry_text"}


def _remediator(store: Store, settings: Settings, mode: str) -> Remediator:
    policy = Policy.model_validate({"rules": [
        {"id": "agent-rollback", "action": "rollback", "target": "*", "mode": mode}]})
    return Remediator(store, policy, lambda: LifecycleClient.from_settings(settings))


@pytest.mark.parametrize(("mode", "status"), [("approve", ToolStatus.APPROVAL_REQUIRED),
                                              ("off", ToolStatus.DENIED),
                                              ("dry_run", ToolStatus.OK)])
def test_a_proposal_is_decided_by_the_policy_and_ledgered(
        store: Store, tmp_path: Path, mode: str, status: ToolStatus) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    box = Toolbox(store, _remediator(store, settings, mode), now=lambda: T0,
                  actor="agent:alice")
    result = box.call("propose_action", kind="rollback", model="echo", version="v2",
                      reason="canary is slow")
    assert result.status is status
    ledger = [(actor, json.loads(entry)) for actor, entry in
              store.query("SELECT actor, entry FROM ledger ORDER BY seq").rows]
    assert (ledger[0][0], ledger[0][1]["status"], ledger[0][1]["kind"]) == (
        "agent:alice", "proposed", "rollback")
    assert ledger[-1][1]["status"] == {"approve": "pending", "off": "denied",
                                       "dry_run": "dry_run"}[mode]


def test_only_known_action_kinds_can_be_proposed(store: Store, tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    box = Toolbox(store, _remediator(store, settings, "approve"))
    assert "kind must be one of" in (box.call("propose_action", kind="delete_cluster",
                                              model="echo").error or "")
    assert "scale needs" in (box.call("propose_action", kind="scale", model="echo").error or "")
    assert store.count("actions") == 0


def test_a_pending_action_is_decided_through_the_agent(store: Store, tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    remediator = _remediator(store, settings, "approve")
    box = Toolbox(store, _Both(remediator), now=lambda: T0, actor="slack:bob")
    pending = box.call("propose_action", kind="rollback", model="echo", version="v2")
    assert pending.status is ToolStatus.APPROVAL_REQUIRED
    denied = box.call("decide_action", action_id=pending.data["action_id"], approve=False)
    assert denied.ok and denied.data["status"] == "denied"
    again = box.call("decide_action", action_id=pending.data["action_id"], approve=True)
    assert again.status is ToolStatus.ERROR and "not pending" in (again.error or "")
    assert "no action" in (box.call("decide_action", action_id="act-0123456789ab",
                                    approve=True).error or "")
    actors = [a for (a,) in store.query("SELECT actor FROM ledger ORDER BY seq").rows]
    assert actors[-1] == "slack:bob"


class _Both:
    """The remediator's propose and decide_pending, as the server wires them."""

    def __init__(self, remediator: Remediator) -> None:
        self.r = remediator

    def propose(self, action: Any, actor: str, now_ns: int) -> dict[str, Any]:
        return self.r.propose(action, actor, now_ns)

    def decide(self, action_id: str, approve: bool, actor: str, now_ns: int
               ) -> dict[str, Any]:
        return self.r.decide_pending(action_id, approve, actor, now_ns)


def test_an_apps_incidents_are_those_of_all_its_deployments(store: Store) -> None:
    """`shop` is a Serve application: its ingress (service `shop`), `shop.Scorer` (aiops'
    name for a deployment) and `recs` (a deployment with an OTEL_SERVICE_NAME of its own,
    known from its spans' `ray.serve.app`) are all shop; `cart` is another app."""
    from agents.intent import Intent, IntentKind
    from agents.investigate import investigate
    from agents.narrate import template_narrative
    from aiops.analytics.findings import Entity, FaultClass, Finding
    from aiops.analytics.incidents import IncidentTracker

    recs = span(T0 - 300 * NS, 20, model="recs", version="cfg-1")
    recs["resource_attributes"] = json.dumps({"ray.serve.app": "shop"})
    add_spans(store, [recs])
    tracker = IncidentTracker(store=store)
    for k, service in enumerate(("shop.Scorer", "recs", "cart", "shop")):
        at = T0 - (600 - 60 * k) * NS
        tracker.update([Finding("trace_errors", Entity(service, "cfg-2"), FaultClass.ERRORS,
                                3.0, at, at, f"errors on {service}",
                                change=f"{service}@cfg-2 released")], at)
    box = Toolbox(store, now=lambda: T0)
    listed = box.call("list_incidents", minutes=20, model="shop")
    assert listed.ok and sorted(i["service"] for i in listed.data) == [
        "recs", "shop", "shop.Scorer"]
    inv = investigate(box, Intent(kind=IntentKind.INVESTIGATE, model="shop", minutes=20))
    cited = {e.id for e in inv.evidence if e.kind == "incident"}
    assert cited == {i["incident_id"] for i in listed.data}
    # The answer's text names every one of them, not only the one it leads with.
    text = template_narrative(inv).text
    assert all(i["incident_id"] in text for i in listed.data), text


def test_what_was_found_but_not_paged_is_the_answer_when_nothing_paged(store: Store) -> None:
    """CPU contention inside the model's SLO is a finding, not a page: asked about the model,
    the agent states it as what the analyzer found, with no incident."""
    from agents.agent import Agent
    from aiops.analytics.findings import Entity, FaultClass, Finding

    runq = Finding("ebpf_runq", Entity("echo", "v1", "r1"), FaultClass.CPU, 2.5,
                   T0 - 120 * NS, T0, "echo@v1/r1: run-queue wait 1.5 ms per wakeup, 40x "
                   "its past")
    tail = Finding("trace_latency", Entity("other", "v1"), FaultClass.LATENCY, 1.2,
                   T0 - 30 * NS, T0, "a tail on another model")
    box = Toolbox(store, now=lambda: T0, findings=lambda: [runq, tail])
    found = box.call("list_findings", minutes=15, model="echo")
    assert found.ok and [c["service"] for c in found.data["causes"]] == ["echo"]
    answer = Agent(box).ask("what is wrong with echo in the last 15 minutes?")
    assert answer.facts is not None
    assert (answer.facts.component, answer.facts.version, answer.facts.replica,
            answer.facts.fault_class) == ("echo", "v1", "r1", "cpu")
    assert answer.facts.status == "finding" and "No incident" in answer.narrative.text

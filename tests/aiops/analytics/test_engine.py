"""The analyzer round: detect, fold into incidents, persist with evidence."""

from __future__ import annotations

import json

from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.slo import Objective
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, traffic


def test_a_slow_canary_becomes_an_incident_attributed_to_it(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    traffic(store, T0 - 20 * NS, 20, 2, 400, version="v2")
    analyzer = Analyzer(store, AnalyzerConfig(objectives=(Objective("echo", 100),)))
    changed = analyzer.step(T0)
    assert len(changed) == 1
    row = store.query("SELECT status, service, model_version, fault_class, evidence "
                      "FROM incidents_current").rows
    assert [r[:4] for r in row] == [("open", "echo", "v2", "latency")]
    evidence = json.loads(row[0][4])
    top = evidence["root_causes"][0]
    assert top["entity"] == "echo@v2" and top["confidence"] > 0.5
    kinds = {e["kind"] for e in top["evidence"]}
    assert {"trace", "metric"} <= kinds
    traces = [e["id"] for e in top["evidence"] if e["kind"] == "trace"]
    assert store.query("SELECT count(*) FROM spans WHERE trace_id = ?",
                       [traces[0]]).rows[0][0] > 0


def test_it_resolves_once_the_sli_recovers(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 500)
    analyzer = Analyzer(store, AnalyzerConfig(resolve_after_s=30,
                                              objectives=(Objective("echo", 100),)))
    assert analyzer.step(T0)
    traffic(store, T0, 60, 5, 50)  # healthy again
    analyzer.step(T0 + 30 * NS)
    analyzer.step(T0 + 61 * NS)
    states = store.query("SELECT status FROM incidents ORDER BY updated_at").rows
    assert states[0] == ("open",) and states[-1] == ("resolved",)
    assert store.query("SELECT closed_at IS NOT NULL FROM incidents_current").rows == [(True,)]

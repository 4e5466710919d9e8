"""Trace anomalies: latency and errors per operation, against its own past or its siblings."""

from __future__ import annotations

from aiops.analytics.findings import FaultClass
from aiops.analytics.traces import TraceThresholds, trace_findings
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, traffic

T = TraceThresholds(window_s=20, baseline_s=600)


def test_steady_latency_is_not_an_anomaly(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50)
    assert trace_findings(store, T0, T) == []


def test_a_latency_step_fires_for_the_version_and_operation(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 400)  # the change point: 20 s ago, 8x slower
    found = [f for f in trace_findings(store, T0, T) if f.entity.service == "echo"]
    assert [(f.entity.version, f.fault_class) for f in found] == [("v1", FaultClass.LATENCY)]
    assert found[0].score > 1
    assert any(e.kind == "trace" for e in found[0].evidence)


def test_a_slow_canary_is_compared_with_its_stable_sibling(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 300, 5, 50, version="v1")
    traffic(store, T0 - 20 * NS, 20, 1, 350, version="v2")  # new: no history of its own
    found = {(f.entity.service, f.entity.version, f.fault_class)
             for f in trace_findings(store, T0, T)}
    assert ("echo", "v2", FaultClass.LATENCY) in found
    assert ("echo", "v1", FaultClass.LATENCY) not in found


def test_an_error_burst_fires_errors(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 20 * NS, 20, 5, 50, status=500)
    found = {(f.entity.service, f.fault_class) for f in trace_findings(store, T0, T)}
    assert ("echo", FaultClass.ERRORS) in found


def test_too_few_spans_say_nothing(store: Store) -> None:
    traffic(store, T0 - 300 * NS, 280, 5, 50)
    traffic(store, T0 - 3 * NS, 1, 3, 900)
    assert trace_findings(store, T0, T) == []

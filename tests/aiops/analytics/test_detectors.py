"""The detector registry: named detectors, each run once a round; one that fails is counted
and the others still report; detectors come and go at run time; a query two detectors need
runs once a round."""

from __future__ import annotations

from typing import Any

import pytest

from aiops.analytics.detectors import DetectorRegistry, Round, TraceDetector
from aiops.analytics.engine import Analyzer, AnalyzerConfig
from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.kernel import KernelEventsDetector, kernel_findings
from aiops.analytics.slo import Objective
from aiops.errors import AIOpsError, QueryTimeout
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_points

REPLICA = {"gen_ai.request.model": "echo", "aiops.model.version": "v1",
           "ray.serve.replica": "r1", "process.pid": "42"}


def finding(detector: str, now_ns: int = T0) -> Finding:
    return Finding(detector, Entity("echo", "v1"), FaultClass.LATENCY, 1.0, now_ns - NS,
                   now_ns, detector)


class Fixed:
    def __init__(self, name: str) -> None:
        self.name = name
        self.rounds = 0

    def findings(self, ctx: Round) -> list[Finding]:
        self.rounds += 1
        return [finding(self.name, ctx.now_ns)]


class Failing:
    name = "broken"

    def findings(self, ctx: Round) -> list[Finding]:
        raise QueryTimeout("the store took too long")


def test_a_second_detector_of_the_same_name_is_refused() -> None:
    registry = DetectorRegistry([Fixed("a")])
    with pytest.raises(ValueError, match="'a'"):
        registry.register(Fixed("a"))
    assert registry.names() == ["a"]


def test_a_failing_detector_is_counted_and_the_others_still_report(store: Store) -> None:
    registry = DetectorRegistry([Fixed("a"), Failing(), Fixed("b")])
    for k in range(2):
        found = registry.collect(Round(store, T0 + k * NS))
        assert [f.detector for f in found] == ["a", "b"]
    assert registry.failures == {"broken": 2}


def test_the_analyzer_counts_its_detectors_failures(store: Store) -> None:
    analyzer = Analyzer(store, AnalyzerConfig())
    analyzer.registry.register(Failing())
    analyzer.step(T0)
    assert analyzer.stats.detector_failures == {"broken": 1}
    assert analyzer.stats.rounds == 1


def test_detectors_registered_at_run_time_run_from_the_next_round(store: Store) -> None:
    registry = DetectorRegistry()
    late = Fixed("late")

    class Registers:
        name = "registers"

        def findings(self, ctx: Round) -> list[Finding]:
            if "late" not in registry.names():
                registry.register(late)  # during a round: the round's snapshot stands
            return []

    registry.register(Registers())
    assert registry.collect(Round(store, T0)) == []
    assert [f.detector for f in registry.collect(Round(store, T0 + NS))] == ["late"]
    registry.unregister("late")
    registry.unregister(registry.get("registers") or "")
    assert registry.collect(Round(store, T0 + 2 * NS)) == []
    assert registry.names() == [] and late.rounds == 1
    with pytest.raises(KeyError):
        registry.unregister(late)


def test_a_shared_result_is_computed_once_a_round(store: Store) -> None:
    runs: list[int] = []

    class Asks:
        def __init__(self, name: str) -> None:
            self.name = name

        def findings(self, ctx: Round) -> list[Finding]:
            def compute() -> int:
                runs.append(ctx.now_ns)
                return len(runs)

            return [finding(f"{self.name}:{ctx.shared(('count', 'x'), compute)}", ctx.now_ns)]

    registry = DetectorRegistry([Asks("a"), Asks("b")])
    assert [f.detector for f in registry.collect(Round(store, T0))] == ["a:1", "b:1"]
    assert [f.detector for f in registry.collect(Round(store, T0 + NS))] == ["a:2", "b:2"]
    assert runs == [T0, T0 + NS]


def test_a_shared_failure_fails_every_detector_asking_without_running_again(
        store: Store) -> None:
    runs: list[int] = []

    def compute() -> int:
        runs.append(1)
        raise QueryTimeout("slow")

    class Asks:
        def __init__(self, name: str) -> None:
            self.name = name

        def findings(self, ctx: Round) -> list[Finding]:
            ctx.shared("q", compute)
            return []

    registry = DetectorRegistry([Asks("a"), Asks("b"), Fixed("c")])
    assert [f.detector for f in registry.collect(Round(store, T0))] == ["c"]
    assert runs == [1] and registry.failures == {"a": 1, "b": 1}


def test_the_kernel_rules_query_cpu_rates_and_served_requests_once(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # A replica whose run-queue waits and CPU per second both rose: both rules read its CPU
    # time and its requests.
    add_points(store, [
        {"time": T0 - k * 5 * NS, "name": name, "type": kind, "count": 10,
         "sum" if kind == "histogram" else "value": now if k < 4 else before,
         "attributes": dict(REPLICA)}
        for k in range(60) for name, kind, now, before in (
            ("aiops.ebpf.runq.latency", "histogram", 2.5, 0.05),
            ("aiops.process.cpu.time", "sum", 4.0, 0.5))])
    queries: list[str] = []
    query = store.query

    def counted(sql: str, params: list[Any] | None = None, **kw: Any) -> Any:
        queries.append("spans" if "FROM spans" in sql else str((params or [None] * 3)[2]))
        return query(sql, params, **kw)

    monkeypatch.setattr(store, "query", counted)
    found = kernel_findings(store, T0)
    assert [f.detector for f in found] == ["ebpf_runq", "cpu_use"]
    assert queries.count("aiops.process.cpu.time") == 1
    assert queries.count("aiops.ebpf.runq.latency") == 1
    assert queries.count("spans") == 1


def test_the_default_registry_has_every_detector_in_order(store: Store) -> None:
    analyzer = Analyzer(store, AnalyzerConfig(objectives=(Objective("echo", 100),),
                                              own_ports=(4318,)))
    assert analyzer.registry.names() == [
        "slo_burn", "traces", "kernel_runq", "kernel_cpu", "kernel_memory", "kernel_events",
        "logs", "nodes", "metrics"]
    events, traces = analyzer.registry.get("kernel_events"), analyzer.registry.get("traces")
    assert isinstance(events, KernelEventsDetector) and isinstance(traces, TraceDetector)
    assert events.thresholds.exclude_peer_ports == (4318,)
    assert events.thresholds.window_s == analyzer.config.traces.window_s
    assert traces.slow_ms == {"echo": 100}
    assert analyzer.detect(T0) == []


def test_a_detector_not_raising_an_aiops_error_stops_the_round(store: Store) -> None:
    # Bugs are not swallowed per detector (the analyzer's loop logs the failed round).
    class Buggy:
        name = "buggy"

        def findings(self, ctx: Round) -> list[Finding]:
            raise ZeroDivisionError

    registry = DetectorRegistry([Buggy()])
    with pytest.raises(ZeroDivisionError):
        registry.collect(Round(store, T0))
    assert registry.failures == {}
    assert issubclass(QueryTimeout, AIOpsError)

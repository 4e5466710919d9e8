"""Kernel findings from the eBPF collector's metrics: contention against the replica's own
past (once it has one), crashes and OOM kills always, retransmits only beyond the everyday."""

from __future__ import annotations

from typing import Any

from aiops.analytics.findings import FaultClass
from aiops.analytics.kernel import kernel_findings
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_points

REPLICA = {"gen_ai.request.model": "echo", "aiops.model.version": "v1",
           "ray.serve.replica": "r1", "process.pid": "42"}


def runq(t: int, wait_s: float) -> dict[str, Any]:
    return {"time": t, "name": "aiops.ebpf.runq.latency", "type": "histogram", "count": 10,
            "sum": wait_s, "attributes": dict(REPLICA)}


def events(t: int, name: str, n: float) -> dict[str, Any]:
    return {"time": t, "name": name, "type": "sum", "value": n, "attributes": dict(REPLICA)}


def test_a_replica_waiting_far_longer_than_it_used_to_is_cpu_contention(store: Store) -> None:
    add_points(store, [runq(T0 - k * 5 * NS, 0.05) for k in range(5, 60)])  # 10 ms/s
    add_points(store, [runq(T0 - k * 5 * NS, 2.5) for k in range(0, 4)])  # 500 ms/s
    found = kernel_findings(store, T0)
    assert [(f.detector, f.fault_class, str(f.entity)) for f in found] == [
        ("ebpf_runq", FaultClass.CPU, "echo@v1/r1")]


def test_no_contention_is_called_without_a_past_to_compare_with(store: Store) -> None:
    add_points(store, [runq(T0 - k * 5 * NS, 2.5) for k in range(0, 8)])  # 40 s of data
    assert kernel_findings(store, T0) == []


def test_crashes_and_oom_kills_count_from_one(store: Store) -> None:
    add_points(store, [events(T0 - 3 * NS, "aiops.ebpf.process.exits", 1),
                       events(T0 - 2 * NS, "aiops.ebpf.oom.kills", 1)])
    assert {f.fault_class for f in kernel_findings(store, T0)} == {FaultClass.CRASH,
                                                                   FaultClass.MEMORY}


def test_a_few_retransmits_are_noise_many_are_a_finding(store: Store) -> None:
    add_points(store, [events(T0 - 3 * NS, "aiops.ebpf.tcp.retransmits", 3)])
    assert kernel_findings(store, T0) == []
    add_points(store, [events(T0 - 2 * NS, "aiops.ebpf.tcp.retransmits", 9)])
    [f] = kernel_findings(store, T0)
    assert f.fault_class is FaultClass.NETWORK and f.score == 12 / 5


def test_a_replica_stopped_on_purpose_is_not_a_crash(store: Store) -> None:
    def exit_with(status: str) -> dict[str, Any]:
        point = events(T0 - 3 * NS, "aiops.ebpf.process.exits", 1)
        point["attributes"]["process.exit.status"] = status
        return point

    add_points(store, [exit_with("clean"), exit_with("signal:15")])
    assert kernel_findings(store, T0) == []
    add_points(store, [exit_with("error:1")])
    assert [f.fault_class for f in kernel_findings(store, T0)] == [FaultClass.CRASH]

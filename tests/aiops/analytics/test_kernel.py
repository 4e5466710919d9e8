"""Kernel findings from the eBPF collector's metrics: contention against the replica's own
past (once it has one), crashes and OOM kills always, retransmits only beyond the everyday."""

from __future__ import annotations

import json
from typing import Any

from aiops.analytics.findings import FaultClass
from aiops.analytics.kernel import kernel_findings
from aiops.schema import RETIRED_EVENT
from aiops.store import Store
from tests.aiops.analytics.telemetry import (
    NS,
    T0,
    add_logs,
    add_points,
    add_spans,
    log,
    span,
)

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


def test_a_replica_that_announced_its_retirement_exits_without_a_crash(store: Store) -> None:
    # Serve force-exits a replica it stopped (a rollback, a scale-in) once it drained: status
    # 1, like a crash; the replica's retirement record before it says it was on purpose.
    retired = log(T0 - 6 * NS, "replica r1 of echo@v1 retired")
    retired["event_name"] = RETIRED_EVENT
    retired["resource_attributes"] = json.dumps({"ray.serve.replica": "r1"})
    point = events(T0 - 3 * NS, "aiops.ebpf.process.exits", 1)
    point["attributes"]["process.exit.status"] = "error:1"
    add_points(store, [point])
    assert [f.fault_class for f in kernel_findings(store, T0)] == [FaultClass.CRASH]
    add_logs(store, [retired])
    assert kernel_findings(store, T0) == []


def test_retransmits_to_the_aiops_server_itself_are_not_the_replicas_network(store: Store
                                                                             ) -> None:
    point = events(T0 - 3 * NS, "aiops.ebpf.tcp.retransmits", 20)
    point["attributes"]["network.peer.port"] = 4318  # its telemetry export to this server
    add_points(store, [point])
    assert kernel_findings(store, T0, exclude_peer_ports=(4318,)) == []
    assert [f.fault_class for f in kernel_findings(store, T0)] == [FaultClass.NETWORK]


def rss(t: int, mib: float) -> dict[str, Any]:
    return {"time": t, "name": "aiops.process.memory.rss", "type": "gauge",
            "value": mib * 2**20, "attributes": dict(REPLICA)}


def test_resident_memory_climbing_through_the_window_is_a_leak(store: Store) -> None:
    add_points(store, [rss(T0 - k * 2 * NS, 500 + (k % 3)) for k in range(6, 60)])  # steady
    add_points(store, [rss(T0 - k * 2 * NS, 500 + 30 * (6 - k)) for k in range(0, 6)])
    [f] = kernel_findings(store, T0, window_s=10)
    assert (f.detector, f.fault_class, str(f.entity)) == ("rss_growth", FaultClass.MEMORY,
                                                          "echo@v1/r1")
    assert "grew 120 MiB in 5 readings" in f.summary


def test_a_heap_that_goes_up_and_down_is_not_a_leak(store: Store) -> None:
    add_points(store, [rss(T0 - k * 2 * NS, 500) for k in range(6, 60)])
    add_points(store, [rss(T0 - k * 2 * NS, 500 + (200 if k % 2 else 0) + 10 * (6 - k))
                       for k in range(0, 6)])
    assert kernel_findings(store, T0, window_s=10) == []


def test_a_replica_loading_its_model_is_not_leaking(store: Store) -> None:
    # Its first minute: memory climbs as the weights load, with no normal to judge by.
    add_points(store, [rss(T0 - k * 2 * NS, 100 + 40 * (20 - k)) for k in range(0, 20)])
    assert kernel_findings(store, T0, window_s=10) == []


def cpu(t: int, seconds: float) -> dict[str, Any]:
    return {"time": t, "name": "aiops.process.cpu.time", "type": "sum", "value": seconds,
            "attributes": dict(REPLICA)}


def test_a_replica_burning_far_more_cpu_than_it_used_to_is_cpu(store: Store) -> None:
    add_points(store, [cpu(T0 - k * 2 * NS, 0.1) for k in range(6, 60)])  # 0.05 core
    add_points(store, [cpu(T0 - k * 2 * NS, 0.8) for k in range(0, 5)])  # 0.4 core
    [f] = kernel_findings(store, T0, window_s=10)
    assert (f.detector, f.fault_class) == ("cpu_use", FaultClass.CPU)


def test_a_little_more_cpu_is_not_a_finding(store: Store) -> None:
    add_points(store, [cpu(T0 - k * 2 * NS, 0.02) for k in range(6, 60)])  # 0.01 core
    add_points(store, [cpu(T0 - k * 2 * NS, 0.1) for k in range(0, 5)])  # 0.05: 5x, tiny
    assert kernel_findings(store, T0, window_s=10) == []


def test_memory_swinging_within_its_usual_range_is_not_a_leak(store: Store) -> None:
    # An OCR pipeline: every request allocates and frees a few hundred MiB.
    add_points(store, [rss(T0 - k * 2 * NS, 400 + 300 * (k % 4 == 0)) for k in range(6, 60)])
    add_points(store, [rss(T0 - k * 2 * NS, 400 + 60 * (5 - k)) for k in range(0, 5)])
    assert kernel_findings(store, T0, window_s=10) == []


def test_a_leak_that_began_mid_window_shows_once_it_has_grown(store: Store) -> None:
    # Flat for the window's first half, then 40 MiB a reading: the climb is judged alone.
    add_points(store, [rss(T0 - k * 2 * NS, 500) for k in range(3, 60)])
    add_points(store, [rss(T0 - k * 2 * NS, 500 + 40 * (3 - k)) for k in range(0, 3)])
    [f] = kernel_findings(store, T0, window_s=10)
    assert f.detector == "rss_growth" and "grew 120 MiB in 4 readings" in f.summary


def test_the_peak_of_a_replicas_first_minute_is_not_its_usual_range(store: Store) -> None:
    # Loading the weights peaked at 700 MiB; settled at 500, it now climbs to 620.
    add_points(store, [rss(T0 - k * 2 * NS, 700 if k > 50 else 500) for k in range(5, 60)])
    add_points(store, [rss(T0 - k * 2 * NS, 500 + 30 * (4 - k)) for k in range(0, 5)])
    [f] = kernel_findings(store, T0, window_s=10)
    assert f.detector == "rss_growth"


def served(store: Store, t_from: int, t_to: int, per_s: float, ms: float = 20) -> None:
    rows = []
    for i in range(round((t_to - t_from) / NS * per_s)):
        row = span(t_from + int(i * NS / per_s), ms)
        row["resource_attributes"] = json.dumps({"ray.serve.replica": "r1"})
        rows.append(row)
    add_spans(store, rows)


def test_a_replica_spending_far_more_cpu_per_request_is_cpu_even_when_starved(
        store: Store) -> None:
    # 2 requests/s at 20 ms each; then starved, 1 request/s at 100 ms each: its CPU per
    # second only goes from 0.04 to 0.10 core (below cpu_use's floor), per request 5x.
    add_points(store, [cpu(T0 - k * 2 * NS, 0.08) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.2) for k in range(0, 5)])
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 20, 2.0)
    served(store, T0 - 10 * NS, T0 - NS // 20, 1.0)
    [f] = kernel_findings(store, T0, window_s=10)
    assert (f.detector, f.fault_class) == ("cpu_per_request", FaultClass.CPU)
    assert "100 ms of CPU per request over 10 requests (was 20 ms)" in f.summary


def test_more_requests_at_their_usual_cost_are_not_cpu(store: Store) -> None:
    # Traffic doubles and so does CPU per second (+0.04 core): the same 20 ms a request.
    add_points(store, [cpu(T0 - k * 2 * NS, 0.08) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.16) for k in range(0, 5)])
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 20, 2.0)
    served(store, T0 - 10 * NS, T0 - NS // 20, 4.0)
    assert kernel_findings(store, T0, window_s=10) == []


def test_cpu_per_request_needs_enough_requests_to_judge(store: Store) -> None:
    # An idle replica's background threads over 2 requests are not 2 heavy requests.
    add_points(store, [cpu(T0 - k * 2 * NS, 0.08) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.06) for k in range(0, 5)])
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 20, 2.0)
    served(store, T0 - 10 * NS, T0 - NS // 20, 0.2)
    assert kernel_findings(store, T0, window_s=10) == []


def test_a_low_rate_models_heavy_requests_arriving_together_are_not_cpu(store: Store) -> None:
    # OCR at one request per 10 s, 2 CPU-seconds each (0.2 core); two land in one window:
    # 0.4 core, twice its past and +0.2 core, at its usual cost per request.
    add_points(store, [cpu(T0 - k * 2 * NS, 0.4) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.8) for k in range(0, 5)])
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 20, 0.1)
    served(store, T0 - 10 * NS, T0 - NS // 20, 0.2)
    assert kernel_findings(store, T0, window_s=10) == []


def test_waits_that_grow_with_the_replicas_own_work_are_not_contention(store: Store) -> None:
    # Its threads outnumber the cores: running 4x more, it waits 4x more (per CPU-second
    # the same), and served nothing unusual per request.
    add_points(store, [runq(T0 - k * 2 * NS, 0.1) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.2) for k in range(5, 60)])
    add_points(store, [runq(T0 - k * 2 * NS, 0.4) for k in range(0, 5)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.8) for k in range(0, 5)])
    assert [f.detector for f in kernel_findings(store, T0, window_s=10)
            if f.detector == "ebpf_runq"] == []


def test_a_replica_waiting_more_for_each_second_it_runs_is_contended(store: Store) -> None:
    add_points(store, [runq(T0 - k * 2 * NS, 0.1) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.2) for k in range(5, 60)])
    add_points(store, [runq(T0 - k * 2 * NS, 0.6) for k in range(0, 5)])  # 6x the wait
    add_points(store, [cpu(T0 - k * 2 * NS, 0.15) for k in range(0, 5)])  # for less CPU
    [f] = kernel_findings(store, T0, window_s=10)
    assert (f.detector, f.fault_class) == ("ebpf_runq", FaultClass.CPU)


def contended(store: Store) -> None:
    """Waits per second 6x its past, for less CPU than it used to run."""
    add_points(store, [runq(T0 - k * 2 * NS, 0.1) for k in range(5, 60)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.2) for k in range(5, 60)])
    add_points(store, [runq(T0 - k * 2 * NS, 0.6) for k in range(0, 5)])
    add_points(store, [cpu(T0 - k * 2 * NS, 0.15) for k in range(0, 5)])


def test_contention_that_slows_the_replicas_requests_is_cpu(store: Store) -> None:
    contended(store)
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 5, 1.0, ms=20)
    served(store, T0 - 10 * NS, T0 - NS // 5, 1.0, ms=60)  # 3x slower
    assert [f.detector for f in kernel_findings(store, T0, window_s=10)] == ["ebpf_runq"]


def test_contention_its_requests_do_not_feel_is_someone_elses_busy_moment(
        store: Store) -> None:
    # The soak's case: a low-rate model's replica waited for the cores for a few seconds
    # while its requests ran at their usual speed.
    contended(store)
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 5, 1.0, ms=20)
    served(store, T0 - 10 * NS, T0 - NS // 5, 1.0, ms=22)
    assert kernel_findings(store, T0, window_s=10) == []


def test_contention_over_too_few_requests_to_judge_them_is_not_a_finding(
        store: Store) -> None:
    contended(store)
    served(store, T0 - 120 * NS, T0 - 10 * NS - NS // 5, 0.2, ms=20)
    served(store, T0 - 10 * NS, T0 - NS // 5, 0.2, ms=60)  # 2 requests in the window
    assert kernel_findings(store, T0, window_s=10) == []

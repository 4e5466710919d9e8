"""The one periodic worker and the components' lifecycle: a step that raises is logged,
counted and backed off, never the end of the loop; components start in order and close in
reverse, and a start that fails closes what started before it."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from aiops.periodic import Components, Periodic, PeriodicMetrics


def _until(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_failing_step_is_counted_backed_off_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    calls: list[int] = []
    recovered = threading.Event()

    def step() -> None:
        calls.append(1)
        if len(calls) <= 3:
            raise OSError("disk full")  # not a StoreError: the old loops died on these
        recovered.set()

    worker = Periodic("retention", 0.01, step, metrics=PeriodicMetrics(registry))
    assert worker.wait_s() == pytest.approx(0.01)
    worker.run_once()
    worker.run_once()
    # Two failures in a row: the wait doubled twice.
    assert worker.wait_s() == pytest.approx(0.04)
    health = worker.health()
    assert (health.streak, health.failures, health.last_error) == (2, 2, "OSError: disk full")
    assert registry.get_sample_value("aiops_component_failing", {"component": "retention"}) == 2
    worker.start()
    try:
        _until(recovered.is_set)
    finally:
        worker.close(timeout_s=5)
    health = worker.health()
    assert health.streak == 0 and health.failures == 3 and not health.failing
    assert registry.get_sample_value("aiops_component_runs_total",
                                     {"component": "retention", "outcome": "failed"}) == 3
    assert registry.get_sample_value("aiops_component_failing", {"component": "retention"}) == 0
    # The first failure of the streak carries its traceback; the recovery is said.
    assert any(r.exc_info for r in caplog.records if "retention failed" in r.getMessage())
    assert any("works again after 3 failed runs" in r.getMessage() for r in caplog.records)


def test_the_backoff_is_bounded() -> None:
    worker = Periodic("x", 1.0, lambda: 1 / 0, max_backoff=4.0)
    for _ in range(10):
        worker.run_once()
    assert worker.wait_s() == 4.0
    assert Periodic("y", 1.0, lambda: None, max_backoff=0.5).max_backoff == 1.0
    with pytest.raises(ValueError, match="interval_s must be positive"):
        Periodic("z", 0, lambda: None)


def test_run_first_runs_at_once_and_close_stops_the_thread() -> None:
    ran = threading.Event()
    worker = Periodic("attach", 3600, ran.set, run_first=True)
    worker.start()
    try:
        _until(ran.is_set)
    finally:
        worker.close(timeout_s=5)
    assert worker.stopping
    assert not any(t.name == "attach" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="already started"):
        worker.start()


class _Probe:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def start(self) -> None:
        if self.fail:
            raise OSError(f"{self.name} cannot bind")
        self.log.append(f"start {self.name}")

    def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_components_start_in_order_and_close_in_reverse() -> None:
    log: list[str] = []
    components = Components()
    for name in ("lake", "grpc", "analyzer"):
        components.add(name, _Probe(name, log))
    components.on_close("pool", lambda: log.append("close pool"))
    components.start()
    components.close()
    assert log == ["start lake", "start grpc", "start analyzer",
                   "close pool", "close analyzer", "close grpc", "close lake"]
    assert components.names() == ["lake", "grpc", "analyzer", "pool"]


def test_a_start_that_fails_closes_what_started_before_it() -> None:
    log: list[str] = []
    components = Components()
    components.add("lake", _Probe("lake", log))
    components.add("grpc", _Probe("grpc", log, fail=True))
    components.add("analyzer", _Probe("analyzer", log))
    with pytest.raises(OSError, match="grpc cannot bind"):
        components.start()
    assert log == ["start lake", "close lake"]


def test_health_lists_the_periodic_components() -> None:
    components = Components()
    failing = Periodic("lake-sync", 1.0, lambda: 1 / 0)
    failing.run_once()
    components.add("lake-sync", failing)
    components.add("grpc", _Probe("grpc", []))
    assert [(h.name, h.failing) for h in components.health()] == [("lake-sync", True)]

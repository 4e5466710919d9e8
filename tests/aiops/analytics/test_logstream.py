"""Live log findings: a burst of a new error template, not the info lines that follow traffic."""

from __future__ import annotations

from aiops.analytics.findings import FaultClass
from aiops.analytics.logstream import LogDetector
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_logs, log


def steady(start_ns: int, seconds: int, per_s: int = 5) -> list[dict[str, object]]:
    return [log(start_ns + i * NS // per_s, f"chat answered 200 in {i % 7}.{i % 3} s")
            for i in range(seconds * per_s)]


def test_steady_info_logs_are_not_findings(store: Store) -> None:
    detector = LogDetector(bucket_s=10, warmup=6)
    add_logs(store, steady(T0 - 120 * NS, 120))
    assert detector.findings(store, T0) == []


def test_a_burst_of_a_new_error_template_is_an_errors_finding(store: Store) -> None:
    detector = LogDetector(bucket_s=10, warmup=6)
    add_logs(store, steady(T0 - 120 * NS, 100))
    detector.findings(store, T0 - 20 * NS)  # warms up on the last 80 s
    burst = [log(T0 - 19 * NS + i * NS // 4, f"inference failed: backend error {1000 + i}",
                 severity=17, version="v2") for i in range(30)]
    add_logs(store, burst + steady(T0 - 10 * NS, 10))  # later lines close the burst's bucket
    found = detector.findings(store, T0)
    assert [(f.entity.service, f.entity.version, f.fault_class) for f in found] == [
        ("echo", "v2", FaultClass.ERRORS)]
    template = found[0].evidence[0]
    assert template.kind == "log_template" and "inference failed" in template.id
    assert found[0].evidence[1].kind == "trace"

"""Detection never waits on an action: with remediation on its own worker, a control plane
that hangs for a minute holds the worker, not the analytics rounds, and a second fault that
comes meanwhile opens its incident in its own round."""

from __future__ import annotations

import socket
import time

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import IncidentTracker
from aiops.lifecycle import LifecycleClient
from aiops.remediation.policy import Policy
from aiops.remediation.remediator import Remediator
from aiops.remediation.worker import RoundWorker
from aiops.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def _slow(service: str, now_ns: int) -> Finding:
    return Finding("trace_latency", Entity(service, "v2"), FaultClass.LATENCY, 3.0,
                   now_ns - 10 * NS, now_ns, "p95 8x its baseline",
                   change=f"{service}@v2 first served 40 s ago, after v1")


def test_a_hung_control_plane_holds_the_worker_not_detection(store: Store) -> None:
    # A control plane that accepts the connection and never answers (60 s client timeout).
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    policy = Policy.model_validate({"verify_s": 120, "approval_ttl_s": 600, "rules": [
        {"id": "scale", "action": "scale", "target": "*", "mode": "auto", "max_replicas": 4}]})
    remediator = Remediator(store, policy, lambda: LifecycleClient(url, "t", timeout_s=60))
    tracker = IncidentTracker(resolve_after_s=30, store=store)
    worker = RoundWorker(remediator.on_round)
    remediator.attach(tracker, worker.submit)
    worker.start()
    try:
        started = time.monotonic()
        (first,) = tracker.update([_slow("chat", T0)], T0)
        time.sleep(0.5)  # the worker is now in the hung call, planning for the first
        assert not worker.idle(0.1)
        (second,) = [i for i in tracker.update([_slow("chat", T0 + NS),
                                                _slow("embed", T0 + NS)], T0 + NS)
                     if i.incident_id != first.incident_id]
        for i in range(2, 6):  # rounds go on, each in its own time
            tracker.update([_slow("chat", T0 + i * NS), _slow("embed", T0 + i * NS)],
                           T0 + i * NS)
        # Far under the 60 s the control plane hangs for (slack for a loaded CI machine).
        assert time.monotonic() - started < 30.0, "a round waited on the control plane"
        assert second.causes[0].entity.service == "embed"
        assert {r[0] for r in store.query("SELECT service FROM incidents").rows} == \
            {"chat", "embed"}
        assert not worker.idle(0.1)  # still in the call: nothing planned yet, nothing lost
    finally:
        hung.close()
        worker.close(timeout_s=1)

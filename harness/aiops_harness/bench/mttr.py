"""`aiops bench mttr`: fault injected -> detected -> action executed -> SLI recovered.

The embedded stack with a fast model (echo, SLO: 95% of requests within 100 ms) under steady
traffic from two clients; each run puts a canary v2 with 300 ms of injected latency on 30% of
the traffic, and the remediator, under an auto-rollback policy, has to find and undo it.
Times, from the moment the canary took traffic:

- detected: the incident attributed to echo v2 was opened (its ``opened_at``);
- acted: the rollback was executed (the ``executed`` row of the action);
- recovered: the last request slower than the objective, as the clients saw it.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import AIOpsError
from aiops.lifecycle import LifecycleClient
from aiops_harness.bench.common import free_port

__all__ = ["MttrResult", "run_mttr"]

SLO_MS = 100.0
MODEL = {"name": "echo", "backend": "echo", "model_type": "llm", "max_ongoing_requests": 8,
         "resources": {"num_cpus": 0.1},
         "qos": {"max_queue": 64, "slo": {"p95_ms": SLO_MS, "error_rate": 0.05}}}
POLICY = {"default_mode": "dry_run", "verify_s": 60, "max_concurrent": {"rollback": 1},
          "rules": [{"id": "auto-rollback", "action": "rollback", "target": "*",
                     "mode": "auto"}]}


@dataclass
class Run:
    detected_s: float
    acted_s: float
    recovered_s: float


@dataclass
class MttrResult:
    runs: list[Run] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return float(statistics.median(float(getattr(r, attr)) for r in self.runs))


class _Clients:
    """Two clients sending chat requests back to back; every request's end time and latency."""

    def __init__(self, url: str) -> None:
        self.stop = threading.Event()
        self.samples: list[tuple[float, float]] = []  # (end, seconds), wall clock
        self.threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not self.stop.is_set():
                started = time.perf_counter()
                c.post("/v1/chat/completions", json={
                    "model": "echo", "messages": [{"role": "user", "content": "ping"}]})
                self.samples.append((time.time(), time.perf_counter() - started))

    def last_slow_after(self, t0: float) -> float | None:
        slow = [end for end, s in self.samples if end > t0 and s * 1000 > SLO_MS]
        return max(slow) if slow else None

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()


def _wait(what: str, timeout_s: float, probe: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AIOpsError(f"mttr: {what} did not happen within {timeout_s:.0f} s")


def _one_run(settings: Settings, control: LifecycleClient, db: ServerClient,
             clients: _Clients, seen: set[str]) -> Run:
    control.set_faults("echo", "v2", {"latency_ms": 300})
    t_fault = time.time()
    control.canary("echo", "v2", 30)

    def rollback() -> dict[str, Any] | None:
        for a in db.actions("executed") + db.actions("verified"):
            if a["kind"] == "rollback" and a["action_id"] not in seen:
                return a
        return None

    action = _wait("a rollback", 120, rollback)
    seen.add(action["action_id"])
    incident = db.incident(action["incident_id"])
    executed = db.rows("SELECT epoch_ns(updated_at) AS t FROM actions WHERE action_id = ? "
                       "AND status = 'executed'", [action["action_id"]])[0]["t"] / 1e9
    time.sleep(5)  # requests in flight at the rollback finish
    recovered = clients.last_slow_after(t_fault) or executed
    _wait("the incident to resolve", 120, lambda: db.incident(
        action["incident_id"])["status"] == "resolved")
    return Run(_ts(incident["opened_at"]) - t_fault, executed - t_fault, recovered - t_fault)


def run_mttr(runs: int = 3) -> MttrResult:
    from aiops import stack

    result = MttrResult()
    with tempfile.TemporaryDirectory(prefix="aiops-bench-mttr-") as tmp:
        models, policy = Path(tmp) / "models.yaml", Path(tmp) / "policy.yaml"
        models.write_text(yaml.safe_dump({"models": [{**MODEL, "version": "v1"}]}))
        policy.write_text(yaml.safe_dump(POLICY))
        settings = Settings(
            data_dir=Path(tmp) / "stack", server_port=free_port(), serve_port=free_port(),
            control_port=free_port(), ray_metrics_port=free_port(), models_file=models,
            policy_file=policy, analytics_interval_s=1.0, analytics_window_s=8.0,
            analytics_resolve_after_s=8.0, analytics_burn_windows="60/10/6", ebpf="off",
            log_level="WARNING")
        stack.up(settings)
        clients = None
        try:
            clients = _Clients(settings.serve_url)
            time.sleep(15)  # a baseline of v1
            with LifecycleClient.from_settings(settings) as control, \
                    ServerClient.of(settings) as db:
                control.apply([{**MODEL, "version": "v1", "traffic": 100},
                               {**MODEL, "version": "v2", "traffic": 0}])
                seen: set[str] = set()
                for _ in range(runs):
                    result.runs.append(_one_run(settings, control, db, clients, seen))
        finally:
            if clients is not None:
                clients.close()
            stack.down(settings)
    return result

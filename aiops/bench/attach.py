"""``aiops bench attach``: aiops attached to a composed Serve app it did not start.

A separate ``ray start --head`` (token auth on) runs the team's app of tests/fixtures/attach
(a FastAPI ingress calling two model deployments through DeploymentHandles, no observability
code), traced by Serve itself with aiops' exporter (the Serve config's ``tracing_config``).
``aiops server`` runs as users run it, the cluster added with ``aiops attach add``'s file, an
auto-rollback policy. Two clients call the app throughout.

Per run: release 1 runs until aiops keeps it as healthy, then release 2 ships a Scorer failing
30% of its calls. Reported: deploy -> incident (MTTD), deploy -> the clients' last failure
(healthy again), last failure -> rollback verified. Then, optionally, a healthy soak of
release 1: every incident opened in it is a false alarm (goal 0 in 30 minutes).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
import yaml

from aiops.attach.watch import save_managed
from aiops.bench.common import running_server
from aiops.bench.raycluster import FIXTURES, RayCluster, ray_cluster, wait_for
from aiops.config import AttachTarget, Settings

__all__ = ["AttachResult", "AttachRun", "run_attach"]

HEALTHY_AFTER_S = 8.0
POLICY = {"default_mode": "dry_run", "verify_s": 60, "approval_ttl_s": 300,
          # A short cooldown: each run rolls the same app back again.
          "rules": [{"id": "rollback", "action": "rollback", "target": "*", "mode": "auto",
                     "cooldown_s": 5}]}


@dataclass
class AttachRun:
    incident: str
    detected_s: float
    healthy_s: float  # deploy -> the clients' last failed request
    verified_after_s: float  # the clients' last failed request -> rollback verified
    failed_requests: int


@dataclass
class AttachResult:
    runs: list[AttachRun] = field(default_factory=list)
    soak_minutes: float = 0.0
    soak_requests: int = 0
    soak_failed: int = 0
    soak_incidents: list[str] = field(default_factory=list)


class _Clients:
    """Two clients scoring text, counting outcomes and the time of the last failure."""

    def __init__(self, url: str) -> None:
        self.url, self.ok, self.failed, self.last_failed = url, 0, 0, 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                try:
                    good = c.post(self.url, json={"text": "a fine pair of shoes"}
                                  ).status_code == 200
                except httpx.HTTPError:
                    good = False
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed, self.last_failed = self.failed + 1, time.monotonic()
                time.sleep(0.05)

    def __enter__(self) -> _Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def _get(settings: Settings, path: str) -> Any:
    resp = httpx.get(f"{settings.server_url}{path}", timeout=30)
    resp.raise_for_status()
    return resp.json()


def _shop(settings: Settings) -> dict[str, Any] | None:
    apps = _get(settings, "/api/v1/attach")["targets"][0].get("applications", [])
    return next((a for a in apps if a["name"] == "shop"), None)


def _verified(settings: Settings) -> list[dict[str, Any]]:
    return [a for a in _get(settings, "/api/v1/actions")["actions"]
            if a["kind"] == "rollback" and a["status"] == "verified"]


def _incidents(settings: Settings) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = _get(settings, "/api/v1/incidents?limit=1000")["incidents"]
    return out


def _wait_healthy(settings: Settings, timeout_s: float = 240) -> str:
    app = wait_for("release 1 kept as healthy", lambda: (a := _shop(settings))
                   and a["status"] == "RUNNING" and a["version"] in a["healthy_versions"] and a,
                   timeout_s)
    return str(app["version"])


@contextmanager
def _attached(tmp: Path, cluster: RayCluster) -> Iterator[Settings]:
    data = tmp / "server"
    save_managed(data, [AttachTarget(kind="ray", name="team-ray", url=cluster.dashboard_url,
                                     token_file=cluster.token_file,
                                     metrics_url=cluster.metrics_url)])
    (tmp / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    with running_server(tmp, data_dir=data, attach_interval_s=1,
                        attach_healthy_after_s=HEALTHY_AFTER_S, analytics_interval_s=1,
                        analytics_window_s=8, analytics_resolve_after_s=8,
                        policy_file=tmp / "policy.yaml") as (settings, _pid):
        yield settings


def _one_run(cluster: RayCluster, settings: Settings, clients: _Clients, tmp: Path
             ) -> AttachRun:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": settings.server_url}
    cluster.deploy(FIXTURES / "shop-v1.yaml", env, tmp)
    _wait_healthy(settings)
    before = {a["action_id"] for a in _verified(settings)}
    seen = {i["incident_id"] for i in _incidents(settings)}
    failed_before = clients.failed
    deployed_wall, deployed = time.time(), time.monotonic()  # `serve deploy` takes ~1-2 s
    cluster.deploy(FIXTURES / "shop-v2.yaml", env, tmp)
    wait_for("a verified rollback", lambda: [a for a in _verified(settings)
                                            if a["action_id"] not in before], 240)
    verified = time.monotonic()
    new = [i for i in _incidents(settings) if i["incident_id"] not in seen]
    if not new:
        raise RuntimeError("the rollback was verified but no new incident was recorded")
    first = min(new, key=lambda i: i["opened_at"])
    opened = _epoch_s(first["opened_at"])
    # No failed request after the deploy: the clients never saw the fault (healthy at 0 s).
    last_failed = max(clients.last_failed, deployed)
    return AttachRun(f"{first['service']}@{first['model_version']}", opened - deployed_wall,
                     last_failed - deployed, verified - last_failed,
                     clients.failed - failed_before)


def _epoch_s(value: str) -> float:
    from datetime import datetime

    ts = datetime.fromisoformat(value)
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp()


def run_attach(runs: int = 3, soak_minutes: float = 0.0,
               progress: Callable[[str], None] = lambda _: None) -> AttachResult:
    result = AttachResult()
    with tempfile.TemporaryDirectory(prefix="aiops-attach-") as name, ray_cluster() as cluster:
        tmp = Path(name)
        with _attached(tmp, cluster) as settings, \
                _Clients(f"{cluster.serve_url}/shop/score") as clients:
            for i in range(runs):
                run = _one_run(cluster, settings, clients, tmp)
                progress(f"run {i + 1}: {run}")
                result.runs.append(run)
            if soak_minutes > 0:
                cluster.deploy(FIXTURES / "shop-v1.yaml",
                               {"OTEL_EXPORTER_OTLP_ENDPOINT": settings.server_url}, tmp)
                _wait_healthy(settings)
                seen = {i["incident_id"] for i in _incidents(settings)}
                ok, failed = clients.ok, clients.failed
                progress(f"soaking the healthy release for {soak_minutes:g} min")
                time.sleep(soak_minutes * 60)
                result.soak_minutes = soak_minutes
                result.soak_requests = clients.ok - ok + clients.failed - failed
                result.soak_failed = clients.failed - failed
                result.soak_incidents = [
                    f"{i['incident_id']} {i['service']}@{i['model_version']}: {i['summary']}"
                    for i in _incidents(settings) if i["incident_id"] not in seen]
    return result

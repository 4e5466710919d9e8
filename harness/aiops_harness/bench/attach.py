"""``aiops bench attach``: aiops attached to a composed Serve app it did not start.

A separate ``ray start --head`` (token auth on) runs the team's app of harness/aiops_harness/apps
(a FastAPI ingress calling two model deployments through DeploymentHandles, no observability
code), traced by Serve itself with aiops' exporter (the Serve config's ``tracing_config``).
``aiops server`` runs as users run it, the cluster added with ``aiops attach add``'s file, an
auto-rollback policy. Two clients call the app throughout.

Every analytics and attach setting is at its default (``SETTINGS`` says which ones the figures
depend on); the only configuration is the policy: rollbacks on ``auto``.

Per run: release 1 runs until aiops keeps it as healthy, then a bad release ships a Scorer
failing 30% of its calls, the ways teams release (``RELEASES``, in turn): a ``user_config``
change Serve applies in place (the same replicas, reconfigured), or a ``runtime_env`` change
(new replicas). Reported: deploy -> incident (MTTD), deploy -> the clients' last failure
(healthy again), last failure -> rollback verified. Then, optionally, a healthy soak of
release 1 with what a shared cluster does (``SoakPlan``: good ``user_config`` releases, a scale
up and down, traffic from 0.5x to 2x): every incident opened in it is a false page (goal 0;
reported per week). ``noise`` adds a neighbour process taking 50-100% of a core in bursts
throughout, and Serve's HTTP proxies export their spans too (``ray start``'s environment).
"""

from __future__ import annotations

import subprocess
import sys
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
from aiops.config import AttachTarget, Settings
from aiops_harness.bench.common import free_port, running_server
from aiops_harness.bench.raycluster import FIXTURES, RayCluster, ray_cluster, wait_for

__all__ = ["RELEASES", "SETTINGS", "AttachResult", "AttachRun", "SoakPlan", "neighbour",
           "run_attach"]

# The bad releases, in turn: in place (user_config), then new replicas (runtime_env).
RELEASES = ("shop-v3.yaml", "shop-v2.yaml")
# The settings the figures depend on (all at their defaults), printed beside them.
SETTINGS = ("analytics_interval_s", "analytics_window_s", "analytics_resolve_after_s",
            "analytics_recovered_after_s", "attach_interval_s", "attach_healthy_after_s")
WEEK_MIN = 7 * 24 * 60
POLICY = {"default_mode": "dry_run", "verify_s": 60, "approval_ttl_s": 300,
          # A short cooldown: each run rolls the same app back again.
          "rules": [{"id": "rollback", "action": "rollback", "target": "*", "mode": "auto",
                     "cooldown_s": 5}]}


@dataclass
class AttachRun:
    release: str  # the bad release's config file
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
    soak_changes: list[str] = field(default_factory=list)  # the benign changes made
    noise: bool = False
    settings: dict[str, float] = field(default_factory=dict)

    @property
    def pages_per_week(self) -> float:
        return len(self.soak_incidents) / self.soak_minutes * WEEK_MIN \
            if self.soak_minutes else 0.0


class _Clients:
    """Clients scoring text (``active`` of them at a time, two by default, up to four),
    counting outcomes and the time of the last failure."""

    def __init__(self, url: str) -> None:
        self.url, self.ok, self.failed, self.last_failed = url, 0, 0, 0.0
        self.active = 2
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(4)]

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                if i >= self.active:
                    time.sleep(0.2)
                    continue
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
def _attached(tmp: Path, cluster: RayCluster, port: int) -> Iterator[Settings]:
    data = tmp / "server"
    save_managed(data, [AttachTarget(kind="ray", name="team-ray", url=cluster.dashboard_url,
                                     token_file=cluster.token_file,
                                     metrics_url=cluster.metrics_url)])
    (tmp / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    with running_server(tmp, data_dir=data, server_port=port,
                        policy_file=tmp / "policy.yaml") as (settings, _pid):
        yield settings


NEIGHBOUR = """
import random, sys, time
rng = random.Random(int(sys.argv[1]))
while True:
    burst_end, duty = time.monotonic() + rng.uniform(2, 8), rng.uniform(0.5, 1.0)
    while time.monotonic() < burst_end:  # duty x 10 ms busy in every 10 ms
        busy_end = time.monotonic() + 0.01 * duty
        while time.monotonic() < busy_end:
            pass
        time.sleep(0.01 * (1 - duty))
    time.sleep(rng.uniform(1, 10))
"""


@contextmanager
def neighbour(seed: int = 7) -> Iterator[subprocess.Popen[bytes]]:
    """A noisy neighbour: a process taking 50-100% of a core in bursts of 2-8 s, 1-10 s
    apart (seeded), for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(seed)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _one_run(cluster: RayCluster, settings: Settings, clients: _Clients, tmp: Path,
             release: str) -> AttachRun:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": settings.server_url}
    cluster.deploy(FIXTURES / "shop-v1.yaml", env, tmp)
    _wait_healthy(settings)
    before = {a["action_id"] for a in _verified(settings)}
    seen = {i["incident_id"] for i in _incidents(settings)}
    failed_before = clients.failed
    deployed_wall, deployed = time.time(), time.monotonic()  # `serve deploy` takes ~1-2 s
    cluster.deploy(FIXTURES / release, env, tmp)
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
    return AttachRun(release, f"{first['service']}@{first['model_version']}",
                     opened - deployed_wall,
                     last_failed - deployed, verified - last_failed,
                     clients.failed - failed_before)


def _epoch_s(value: str) -> float:
    from datetime import datetime

    ts = datetime.fromisoformat(value)
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class SoakPlan:
    """What a shared cluster does while nothing is wrong, in a cycle of ``cycle_min``
    minutes: a good ``user_config`` release (a new release of the app), the Scorer scaled to
    two replicas and back, traffic at 2x then 0.5x (four clients, then one)."""

    cycle_min: float = 10.0

    def steps(self) -> list[tuple[float, str]]:
        """(share of the cycle, step) in order."""
        return [(0.1, "good release"), (0.3, "scale up"), (0.5, "scale down"),
                (0.6, "traffic 2x"), (0.8, "traffic 0.5x"), (0.95, "traffic 1x")]


def _variant(tmp: Path, name: str, note: str | None = None, scorer_replicas: int = 1
             ) -> Path:
    """Release 1's config with a harmless user_config note (a new, good release) and/or the
    Scorer's replica count (a scale: the same release)."""
    doc: dict[str, Any] = yaml.safe_load((FIXTURES / "shop-v1.yaml").read_text())
    scorer = next(d for d in doc["applications"][0]["deployments"] if d["name"] == "Scorer")
    if note is not None:
        scorer["user_config"] = {**scorer["user_config"], "note": note}
    if scorer_replicas != 1:
        scorer["num_replicas"] = scorer_replicas
    path = tmp / "variants" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def _soak(cluster: RayCluster, settings: Settings, clients: _Clients, tmp: Path,
          minutes: float, plan: SoakPlan, result: AttachResult,
          progress: Callable[[str], None]) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": settings.server_url}
    cluster.deploy(FIXTURES / "shop-v1.yaml", env, tmp)
    _wait_healthy(settings)
    seen = {i["incident_id"] for i in _incidents(settings)}
    ok, failed = clients.ok, clients.failed
    progress(f"soaking for {minutes:g} min: {', '.join(s for _, s in plan.steps())} every "
             f"{plan.cycle_min:g} min")
    start = time.monotonic()
    end = start + minutes * 60
    cycle, current = 0, FIXTURES / "shop-v1.yaml"
    while True:
        for share, step in plan.steps():
            at = start + (cycle + share) * plan.cycle_min * 60
            if at >= end:
                break
            time.sleep(max(0.0, at - time.monotonic()))
            if step == "good release":
                current = _variant(tmp, f"good-{cycle}.yaml", note=f"release {cycle + 2}")
                cluster.deploy(current, env, tmp)
            elif step in ("scale up", "scale down"):
                up = step == "scale up"
                cluster.deploy(_variant(tmp, f"scale-{cycle}-{up}.yaml", note=f"release "
                                        f"{cycle + 2}", scorer_replicas=2 if up else 1),
                               env, tmp)
            else:
                clients.active = {"traffic 2x": 4, "traffic 0.5x": 1}.get(step, 2)
            result.soak_changes.append(f"{(time.monotonic() - start) / 60:.1f} min: {step}")
        else:
            cycle += 1
            continue
        break
    time.sleep(max(0.0, end - time.monotonic()))
    clients.active = 2
    result.soak_minutes = minutes
    result.soak_requests = clients.ok - ok + clients.failed - failed
    result.soak_failed = clients.failed - failed
    result.soak_incidents = [
        f"{i['incident_id']} {i['service']}@{i['model_version']}: {i['summary']}"
        for i in _incidents(settings) if i["incident_id"] not in seen]


def run_attach(runs: int = 3, soak_minutes: float = 0.0, noise: bool = False,
               plan: SoakPlan | None = None,
               progress: Callable[[str], None] = lambda _: None) -> AttachResult:
    """``runs`` bad releases (``RELEASES`` in turn), then ``soak_minutes`` of ``plan``;
    ``noise``: a noisy neighbour throughout, and the proxies' spans exported too."""
    result = AttachResult(noise=noise)
    port = free_port()
    # The proxies read Serve's tracing settings from `ray start`'s environment.
    proxy_env = {"RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH":
                 "aiops.attach.serve_tracing:span_processors",
                 "RAY_SERVE_TRACING_SAMPLING_RATIO": "1",
                 "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"} if noise else {}
    with tempfile.TemporaryDirectory(prefix="aiops-attach-") as name, \
            ray_cluster(proxy_env) as cluster:
        tmp = Path(name)
        with _attached(tmp, cluster, port) as settings, \
                _Clients(f"{cluster.serve_url}/shop/score") as clients, \
                (neighbour() if noise else _nothing()):
            result.settings = {k: float(getattr(settings, k)) for k in SETTINGS}
            for i in range(runs):
                run = _one_run(cluster, settings, clients, tmp, RELEASES[i % len(RELEASES)])
                progress(f"run {i + 1}: {run}")
                result.runs.append(run)
            if soak_minutes > 0:
                _soak(cluster, settings, clients, tmp, soak_minutes, plan or SoakPlan(),
                      result, progress)
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield None

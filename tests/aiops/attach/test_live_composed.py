"""A composed Serve app as teams write them (a FastAPI ingress calling two model deployments
through DeploymentHandles, harness/aiops_harness/apps/shop.py), with no observability code in it,
deployed with `serve deploy` on a Ray cluster aiops did not start. The only change the team
makes is in its Serve config: Serve's own tracing with aiops' exporter. aiops then sees every
deployment as its own service, one trace across the handle calls, each span under the
release the REST API reports; a bad release of one deployment is detected on that deployment,
rolled back through the Serve REST API to the app's previous config (never recorded as
healthy while it fails), and verified.

Two releases, two ways: with the rollback on ``auto``, a ``user_config`` change that Serve
applies in place (the same replica processes, reconfigured), with every analytics setting at
its default; with a person approving, a ``runtime_env`` change (new replicas)."""

from __future__ import annotations

import ast
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.config import AttachTarget, load_settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from aiops_harness.bench.raycluster import FIXTURES, RayCluster, ray_cluster, wait_for
from tests.conftest import RunningServer
from tests.loopback import serving

pytestmark = pytest.mark.stack

HEALTHY_AFTER_S = 8.0


def _policy(mode: str) -> dict[str, Any]:
    return {"default_mode": "dry_run", "verify_s": 60, "approval_ttl_s": 300,
            "rules": [{"id": "rollback", "action": "rollback", "target": "*", "mode": mode,
                       "cooldown_s": 600}]}


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster() as c:
        yield c


# The bad release each policy mode is tried with.
RELEASE = {"auto": "shop-v3.yaml", "approve": "shop-v2.yaml"}


@pytest.fixture(scope="module", params=["auto", "approve"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           cluster: RayCluster) -> Iterator[RunningServer]:
    """A server attached to the cluster, its rollback rule in policy mode ``auto`` (every
    analytics and attach setting at its default), then in ``approve`` (a person approves the
    planned rollback; shorter windows, so the two runs fit the stack lane)."""
    tmp = tmp_path_factory.mktemp("composed")
    (tmp / "policy.yaml").write_text(yaml.safe_dump(_policy(request.param)))
    target = AttachTarget(kind="ray", name="team-ray", url=cluster.dashboard_url,
                          token_file=cluster.token_file, metrics_url=cluster.metrics_url)
    quick: dict[str, Any] = {} if request.param == "auto" else dict(
        attach_interval_s=1, attach_healthy_after_s=HEALTHY_AFTER_S, analytics_window_s=8,
        analytics_resolve_after_s=8)
    settings = load_settings(
        data_dir=tmp / "data", server_port=free_port(), scrape_targets="",
        admin_token=secrets.token_hex(16), policy_file=tmp / "policy.yaml", attach=(target,),
        **quick)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port):
            yield RunningServer(settings.server_url, store, settings)
    finally:
        store.close()


@pytest.fixture(scope="module")
def traffic(cluster: RayCluster) -> Iterator[dict[str, int]]:
    """Two clients scoring text throughout; counts by outcome, and when the last failed."""
    stop = threading.Event()
    counts: dict[str, Any] = {"ok": 0, "failed": 0, "last_failed": 0.0}

    def run() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{cluster.serve_url}/shop/score",
                               json={"text": "a fine pair of shoes"})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                counts["ok" if ok else "failed"] += 1
                if not ok:
                    counts["last_failed"] = time.monotonic()
                time.sleep(0.05)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    yield counts
    stop.set()
    for t in threads:
        t.join(timeout=30)


def _shop(server: RunningServer) -> dict[str, Any] | None:
    resp = httpx.get(f"{server.url}/api/v1/attach", timeout=10)
    resp.raise_for_status()
    apps = resp.json()["targets"][0].get("applications", [])
    return next((a for a in apps if a["name"] == "shop"), None)


def _rollback(server: RunningServer, status: str) -> dict[str, Any] | None:
    actions = httpx.get(f"{server.url}/api/v1/actions", timeout=10).json()["actions"]
    return next((a for a in actions if a["kind"] == "rollback" and a["status"] == status),
                None)


def _deploy(cluster: RayCluster, server: RunningServer, name: str, tmp: Path) -> None:
    cluster.deploy(FIXTURES / name, {"OTEL_EXPORTER_OTLP_ENDPOINT": server.url}, tmp)


def test_the_apps_code_has_no_instrumentation_in_it() -> None:
    tree = ast.parse((FIXTURES / "shop.py").read_text())
    imported = {((n.module or "") if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names}
    assert imported == {"asyncio", "os", "random", "fastapi", "pydantic", "ray"}
    # What the team adds is Serve configuration: its tracing, with aiops' exporter.
    config = yaml.safe_load((FIXTURES / "shop-v1.yaml").read_text())
    assert config["tracing_config"]["exporter_import_path"] == \
        "aiops.attach.serve_tracing:span_processors"


def test_a_bad_release_of_one_deployment_is_named_rolled_back_and_verified(
        cluster: RayCluster, server: RunningServer, traffic: dict[str, Any],
        tmp_path: Path) -> None:
    mode = _policy_mode(server)
    _deploy(cluster, server, "shop-v1.yaml", tmp_path)
    app = wait_for("release 1 kept as healthy", lambda: (a := _shop(server))
                   and a["status"] == "RUNNING" and a["version"] in a["healthy_versions"] and a,
                   180)
    v1 = app["version"]
    assert {d["name"]: (d["service"], d["version"]) for d in app["deployments"]} == {
        "Shop": ("shop", v1), "Tokenizer": ("shop.Tokenizer", v1), "Scorer": ("shop.Scorer", v1)}
    # Serve's own spans, each deployment its own service under the release the REST API
    # reports, one trace from the ingress through both handle calls.
    rows = wait_for("spans of every deployment", lambda: len(r := server.store.query(
        "SELECT service_name, (resource_attributes->>'service.version'), count(*) FROM spans "
        "WHERE (resource_attributes->>'ray.serve.app') = 'shop' GROUP BY ALL").rows) >= 3 and r,
        60)
    assert {(s, v) for s, v, _ in rows} == {("shop", v1), ("shop.Tokenizer", v1),
                                           ("shop.Scorer", v1)}, rows
    joined = server.store.query(
        "SELECT count(DISTINCT c.trace_id) FROM spans c JOIN spans p "
        "ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id "
        "WHERE c.service_name = 'shop.Scorer' AND p.service_name = 'shop' "
        "AND p.kind = 'client'").rows[0][0]
    assert joined > 0  # the ingress' handle call is the Scorer's parent

    deployed_ns, deployed = time.time_ns(), time.monotonic()
    _deploy(cluster, server, RELEASE[mode], tmp_path)
    if mode == "approve":
        pending = wait_for("a rollback waiting for approval",
                           lambda: _rollback(server, "pending"), 120)
        assert _rollback(server, "executed") is None  # nothing done before the approval
        resp = httpx.post(f"{server.url}/api/v1/actions/{pending['action_id']}/approve",
                          headers={"x-aiops-user": "oncall",
                                   "authorization": f"Bearer {server.settings.admin_token}"},
                          timeout=60)
        assert resp.status_code == 200, resp.text
    verified = wait_for("a verified rollback", lambda: _rollback(server, "verified"), 180)
    verified_at = time.monotonic()
    # One incident for the fault, named from its first state as the Scorer at the bad
    # release (the ingress sees the same failures: a symptom held until the Scorer pages,
    # never an incident of its own), and every span of it under that release.
    incidents = server.store.query(
        "SELECT incident_id, arg_min(service, updated_at), arg_min(model_version, updated_at),"
        " min(epoch_ns(opened_at)) FROM incidents WHERE epoch_ns(opened_at) >= ? GROUP BY ALL",
        [deployed_ns]).rows
    assert [(i, s) for i, s, _, _ in incidents] == [(verified["incident_id"], "shop.Scorer")], \
        incidents
    _, _, v2, opened_ns = incidents[0]
    assert v2 != v1 and v2 == _version(server, "shop.Scorer", deployed_ns, failed=True), v2
    assert verified["target"] == f"shop.Scorer@{v2}" and verified["mode"] == mode
    # The cluster runs release 1's config again, and release 2 was never kept as healthy.
    config = cluster.applications()["shop"]["deployed_app_config"]
    scorer = next(d for d in config["deployments"] if d["name"] == "Scorer")
    assert "runtime_env" not in scorer.get("ray_actor_options", {})
    assert v2 not in (_shop(server) or {}).get("healthy_versions", [v2])
    detected_s = (opened_ns - deployed_ns) / 1e9
    healthy_s = traffic["last_failed"] - deployed
    print(f"\ncomposed app ({mode}, {RELEASE[mode]}): bad release deployed -> incident "
          f"{detected_s:.1f} s, failed requests {traffic['failed']}, "
          f"clients' last failure {healthy_s:.1f} s, verified {verified_at - deployed:.1f} s "
          f"(last failure -> verified {verified_at - traffic['last_failed']:.1f} s)")
    assert detected_s <= 15, detected_s
    if mode == "auto":  # with approval, the clients wait for the approver too
        assert healthy_s <= 30, healthy_s
    # At the defaults (auto), verified within 20 s of the clients' last failure.
    assert verified_at - traffic["last_failed"] <= (20 if mode == "auto" else 30)


def _version(server: RunningServer, service: str, since_ns: int, failed: bool) -> str:
    """The one release the service's failed (or good) spans since ``since_ns`` carry."""
    rows = server.store.query(
        "SELECT DISTINCT (resource_attributes->>'service.version') FROM spans "
        "WHERE service_name = ? AND epoch_ns(start_time) >= ? AND status_code = ?",
        [service, since_ns, "error" if failed else "unset"]).rows
    assert len(rows) == 1, rows
    return str(rows[0][0])


def _policy_mode(server: RunningServer) -> str:
    assert server.settings.policy_file is not None
    doc = yaml.safe_load(server.settings.policy_file.read_text())
    return str(doc["rules"][0]["mode"])

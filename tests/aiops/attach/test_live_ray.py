"""aiops attached to a Ray cluster it did not start (`ray start --head` with token auth, the
team's own Serve app deployed with `serve deploy`, instrumented only with the OpenTelemetry SDK):
the app's releases are discovered with their versions, a faulty release is detected and
attributed from the app's own spans, rolled back through Ray's Serve REST API under the policy,
and verified; Ray's own metrics are scraped into DuckDB. What Serve cannot do is refused with
the reason."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.attach.control import ServeControl
from aiops.attach.history import ConfigHistory
from aiops.attach.ray_serve import AttachError, RayServe
from aiops.config import AttachTarget, load_settings
from aiops.remediation.actions import NotSupported
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from aiops_harness.bench.raycluster import FIXTURES, RayCluster, ray_cluster, wait_for
from collectors.ebpf.attribution import ATTACHED_REPLICAS_FILE, local_addresses
from collectors.ebpf.collector import EbpfCollector, preflight
from collectors.ebpf.probes import RunQueueLatency
from tests.conftest import RunningServer
from tests.loopback import serving

pytestmark = pytest.mark.stack

POLICY = {"default_mode": "dry_run", "verify_s": 60, "approval_ttl_s": 300,
          "rules": [{"id": "auto-rollback", "action": "rollback", "target": "*",
                     "mode": "auto", "cooldown_s": 600}]}
HEALTHY_AFTER_S = 8.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def target(cluster: RayCluster) -> AttachTarget:
    return AttachTarget(kind="ray", name="team-ray", url=cluster.dashboard_url,
                        token_file=cluster.token_file, metrics_url=cluster.metrics_url)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, target: AttachTarget
           ) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("attach")
    (tmp / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    settings = load_settings(
        data_dir=tmp / "data", server_port=free_port(), scrape_targets="",
        scrape_interval_s=2, attach=(target,), attach_interval_s=1,
        attach_healthy_after_s=HEALTHY_AFTER_S, analytics_interval_s=1,
        analytics_window_s=8, analytics_resolve_after_s=8, policy_file=tmp / "policy.yaml")
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port):
            yield RunningServer(settings.server_url, store, settings)
    finally:
        store.close()


@pytest.fixture(scope="module")
def traffic(cluster: RayCluster) -> Iterator[dict[str, int]]:
    """Two clients calling the team's endpoint throughout; counts by status."""
    stop, counts = threading.Event(), {"ok": 0, "failed": 0}

    def run() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{cluster.serve_url}/greeter", json={
                        "model": "greeter-1", "messages": [{"role": "user", "content": "hi"}]})
                    counts["ok" if r.status_code == 200 else "failed"] += 1
                except httpx.HTTPError:
                    counts["failed"] += 1
                time.sleep(0.05)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    yield counts
    stop.set()
    for t in threads:
        t.join(timeout=30)


def _attached(server: RunningServer) -> dict[str, Any]:
    resp = httpx.get(f"{server.url}/api/v1/attach", timeout=10)
    resp.raise_for_status()
    target: dict[str, Any] = resp.json()["targets"][0]
    return target


def _greeter(server: RunningServer) -> dict[str, Any] | None:
    apps = _attached(server).get("applications", [])
    return next((a for a in apps if a["name"] == "greeter"), None)


def _action(server: RunningServer, status: str) -> dict[str, Any] | None:
    actions = httpx.get(f"{server.url}/api/v1/actions", timeout=10).json()["actions"]
    return next((a for a in actions if a["kind"] == "rollback" and a["status"] == status),
                None)


def test_a_faulty_release_is_detected_rolled_back_through_serve_and_verified(
        cluster: RayCluster, server: RunningServer, traffic: dict[str, int],
        tmp_path: Path) -> None:
    exporters = {"OTEL_EXPORTER_OTLP_ENDPOINT": server.url}
    cluster.deploy(FIXTURES / "greeter-v1.yaml", exporters, tmp_path)
    cluster.wait_running("greeter", "1")
    # Release 1 runs with no incident long enough to be the one a rollback returns to.
    app = wait_for("release 1 kept as healthy", lambda: (g := _greeter(server))
                and "1" in g["healthy_versions"] and g, 90)
    assert app["service"] == "greeter" and app["version"] == "1" and app["declarative"]
    assert len(app["deployments"][0]["replicas"]) == 1

    deployed_ns = time.time_ns()
    cluster.deploy(FIXTURES / "greeter-v2.yaml", exporters, tmp_path)
    deployed = time.monotonic()
    # No wait for release 2 to show as RUNNING: it may be rolled back before a poll sees it.
    verified = wait_for("a verified rollback", lambda: _action(server, "verified"), 180)
    recovered_s = time.monotonic() - deployed
    assert verified["target"] == "greeter@2" and verified["mode"] == "auto"
    assert verified["outcome"]["recovered_after_s"] > 0

    # The cluster runs release 1's config again, re-applied by aiops through Ray's API.
    greeter = cluster.applications()["greeter"]
    config = greeter["deployed_app_config"]
    # Serve reports the deployment graph aiops reads calls from (one deployment here: a node
    # with no outbound calls).
    nodes = greeter["deployment_topology"]["nodes"]
    assert [n["outbound_deployments"] for n in nodes.values()] == [[]]
    assert config["runtime_env"]["env_vars"]["OTEL_RESOURCE_ATTRIBUTES"] == "service.version=1"
    # The incident named the release from the app's own OpenTelemetry resource.
    incidents = server.store.query(
        "SELECT service, model_version, epoch_ns(opened_at) FROM incidents "
        "WHERE service = 'greeter' ORDER BY opened_at").rows
    assert incidents and incidents[0][:2] == ("greeter", "2")
    detected_s = (incidents[0][2] - deployed_ns) / 1e9
    # The figures docs/benchmarks.md records (run with -s to see them).
    print(f"\nattached Ray Serve: release 2 deployed -> incident {detected_s:.1f} s, "
          f"-> rollback verified {recovered_s:.1f} s")
    failed = server.store.query(
        "SELECT count(*) FROM spans WHERE service_name = 'greeter' AND status_code = 'error' "
        "AND (resource_attributes->>'service.version') = '2'").rows[0][0]
    assert failed > 0
    assert recovered_s < 150, recovered_s


def _greeter_replica(server: RunningServer) -> dict[str, Any] | None:
    path = server.settings.data_dir / ATTACHED_REPLICAS_FILE
    rows = json.loads(path.read_text()) if path.exists() else []
    return next((r for r in rows if r["app"] == "greeter"), None)


def test_the_attached_replicas_processes_are_named_for_the_ebpf_collector(
        cluster: RayCluster, server: RunningServer, traffic: dict[str, int],
        tmp_path: Path) -> None:
    if "greeter" not in cluster.applications():  # run on its own
        cluster.deploy(FIXTURES / "greeter-v1.yaml",
                       {"OTEL_EXPORTER_OTLP_ENDPOINT": server.url}, tmp_path)
    app = wait_for("the greeter app read", lambda: _greeter(server), 90)
    row = wait_for("the greeter replica in attach-replicas.json",
                lambda: _greeter_replica(server), 90)
    # The same service and version as its telemetry, the replica id Serve reports, and the
    # pid of the process Ray titled after that replica, on this node.
    assert (row["model"], row["version"]) == ("greeter", app["version"])
    assert row["node_ip"] in local_addresses()
    assert row["replica"] in app["deployments"][0]["replicas"]
    assert b"ServeReplica:greeter" in Path(f"/proc/{row['pid']}/cmdline").read_bytes()
    if preflight():
        if os.environ.get("AIOPS_REQUIRE_EBPF") == "1":
            pytest.fail("eBPF collector cannot run here: " + "; ".join(preflight()))
        return  # the kernel half needs root and bcc
    # The eBPF collector, as a node's DaemonSet runs it, names the replica's kernel time.
    collector = EbpfCollector(server.url, interval_s=1, probes=(RunQueueLatency,),
                              replicas_file=[server.settings.data_dir / ATTACHED_REPLICAS_FILE])
    try:
        assert not collector.stats.attach_failures
        deadline = time.monotonic() + 30
        rows: list[Any] = []
        while not rows and time.monotonic() < deadline:
            time.sleep(1)
            collector.cycle()
            rows = server.store.query(
                "SELECT DISTINCT (attributes->>'gen_ai.request.model'), "
                "(attributes->>'aiops.model.version'), (attributes->>'ray.serve.replica') "
                "FROM metric_points WHERE name = 'aiops.ebpf.runq.latency' "
                "AND (attributes->>'process.pid')::BIGINT = ?", [row["pid"]]).rows
    finally:
        collector.close()
    assert rows == [("greeter", app["version"], row["replica"])]


def test_rays_own_metrics_are_scraped_with_the_application_labels(
        server: RunningServer) -> None:
    rows = wait_for("Ray's Serve metrics in DuckDB", lambda: server.store.query(
        "SELECT DISTINCT (attributes->>'application') FROM metric_points "
        "WHERE service_name = 'team-ray' AND name LIKE 'ray_serve_%'").rows, 60)
    assert ("greeter",) in rows


def test_what_serve_cannot_do_is_refused_with_the_reason(target: AttachTarget,
                                                        tmp_path: Path) -> None:
    control = ServeControl(target, ConfigHistory(tmp_path / "h.json", HEALTHY_AFTER_S))
    with pytest.raises(NotSupported, match="Serve keeps one config per application"):
        control.set_traffic("greeter", {"1": 50})
    with pytest.raises(NotSupported, match="restarting a replica"):
        control.restart_replica("greeter", "1")
    # An empty history: nothing known to be healthy, so nothing to roll back to.
    with pytest.raises(AttachError, match="no healthy earlier config"):
        control.rollback("greeter")
    with pytest.raises(AttachError, match="not a service of a declaratively deployed"):
        control.rollback("no-such-app")


def test_a_wrong_ray_token_is_a_clear_refusal(target: AttachTarget, tmp_path: Path) -> None:
    bad = tmp_path / "token"
    bad.write_text("0" * 64)
    with pytest.raises(AttachError, match=r"refused aiops. request \(HTTP 403"), \
            RayServe(target.model_copy(update={"token_file": bad})) as rest:
        rest.applications()
    with pytest.raises(AttachError, match="HTTP 401"), \
            RayServe(target.model_copy(update={"token_file": None})) as rest:
        rest.applications()

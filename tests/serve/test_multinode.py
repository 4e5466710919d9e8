"""A real multi-node Ray cluster on this machine (a head and a worker node, each its own
raylet): Serve spreads the replicas over both, one eBPF collector per node reports only its
node's replicas, and losing the worker (its raylet killed) is an incident attributed to that
node, its replicas rescheduled on the head, and the incident resolved once they run. This is also
the end-to-end check of `aiops demo --scenario node-loss` (the same `lose_node` injection on
the same two-node stack), so the demo tests do not start a second one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.stack import read_state
from aiops_harness.bench.raycluster import wait_for
from collectors.ebpf.attribution import REPLICAS_FILE
from collectors.ebpf.collector import preflight
from serve.cluster import lose_node, read_nodes
from tests.conftest import running_stack

pytestmark = pytest.mark.stack

MODELS = Path(__file__).resolve().parents[1] / "models-multinode.yaml"
EBPF = not preflight()


def _replicas(s: Settings) -> list[dict[str, Any]]:
    try:
        return [r for r in json.loads((s.data_dir / REPLICAS_FILE).read_text())
                if r.get("model")]  # the model replicas, not the ingress
    except (OSError, ValueError):
        return []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with running_stack(tmp_path_factory.mktemp("multinode") / "data", MODELS,
                       ray_worker_nodes=1, ebpf_interval_s=1,
                       analytics_resolve_after_s=10) as s:
        yield s


def test_the_cluster_has_a_head_and_a_worker_node_and_replicas_on_both(
        cluster: Settings) -> None:
    nodes = {n.name: n for n in read_nodes(cluster.data_dir)}
    assert set(nodes) == {"head", "worker-1"}
    assert all(n.alive and n.raylet_pid for n in nodes.values())
    assert nodes["head"].node_id != nodes["worker-1"].node_id
    rows = wait_for("two replicas listed", timeout_s=30, check=lambda: len(_replicas(cluster)) == 2
                 and _replicas(cluster))
    assert {r["node"] for r in rows} == {"head", "worker-1"}, rows
    with httpx.Client(base_url=cluster.serve_url, timeout=30) as c:
        r = c.post("/v1/chat/completions", json={
            "model": "echo", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


@pytest.mark.skipif(not EBPF, reason="the eBPF collector cannot run here: "
                    + "; ".join(preflight()))
def test_each_node_has_its_own_collector_reporting_only_its_own_replicas(
        cluster: Settings) -> None:
    names = {c.name for c in read_state(cluster)}
    assert {"ebpf-head", "ebpf-worker-1"} <= names and "ebpf" not in names
    where = {r["replica"]: r["node"]  # the ingress's replica too
             for r in json.loads((cluster.data_dir / REPLICAS_FILE).read_text())}

    def reported() -> dict[str, set[str]]:
        with ServerClient(cluster.server_url) as db:
            rows = db.rows(
                "SELECT DISTINCT (resource_attributes->>'aiops.node.name') AS node, "
                "(attributes->>'ray.serve.replica') AS replica FROM metric_points "
                "WHERE name = 'aiops.process.memory.rss'")
        out: dict[str, set[str]] = {}
        for r in rows:
            out.setdefault(r["node"], set()).add(r["replica"])
        return out if set(out) == {"head", "worker-1"} else {}

    seen = wait_for("resident memory from both nodes' collectors", timeout_s=60, check=reported)
    for node, replicas in seen.items():
        assert {where.get(r) for r in replicas} == {node}, (node, replicas, where)


def test_losing_the_worker_node_is_an_incident_on_it_and_its_replicas_come_back(
        cluster: Settings) -> None:
    stop, codes = threading.Event(), []

    def traffic() -> None:
        with httpx.Client(base_url=cluster.serve_url, timeout=30) as c:
            while not stop.is_set():
                try:
                    codes.append((time.time(), c.post("/v1/chat/completions", json={
                        "model": "echo", "messages": [{"role": "user", "content": "x"}]}
                    ).status_code))
                except httpx.HTTPError:
                    codes.append((time.time(), 0))
                time.sleep(0.05)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        time.sleep(5)
        lost = lose_node(cluster.data_dir, "worker-1")
        lost_at = time.time()
        with ServerClient(cluster.server_url) as db:
            def incident() -> dict[str, Any] | None:
                rows = db.rows("SELECT incident_id FROM incidents WHERE fault_class = 'node' "
                               "AND epoch_ns(updated_at) >= ? ORDER BY updated_at LIMIT 1",
                               [int(lost_at * 1e9)])
                return db.incident(rows[0]["incident_id"]) if rows else None

            inc = wait_for("an incident of fault class node", timeout_s=90, check=incident)
            detected_s = time.time() - lost_at
            top = inc["evidence"]["root_causes"][0]
            assert (inc["service"], top["node"], top["fault_class"]) == ("echo", "worker-1",
                                                                         "node"), inc
            assert "worker-1" in inc["summary"]
            assert any(e["kind"] == "event" for e in top["evidence"])

            moved = wait_for("both replicas running on the head", timeout_s=120, check=lambda: (
                len(rows := _replicas(cluster)) == 2 and {r["node"] for r in rows} == {"head"}
                and rows))
            assert {n.name: n.alive for n in read_nodes(cluster.data_dir)} == {
                "head": True, "worker-1": False}
            done = wait_for("the incident to resolve", timeout_s=120, check=lambda: (
                (cur := db.incident(inc["incident_id"]))["status"] == "resolved" and cur))
            # Serve moves the replicas itself: nothing is planned once the node is known lost,
            # and nothing runs. (Ray declares the node dead some seconds after its requests
            # begin to suffer; a plan for that symptom can come first, and is withdrawn.)
            actions = db.rows(
                "SELECT kind, status, outcome, epoch_ns(created_at) >= (SELECT "
                "min(epoch_ns(updated_at)) FROM incidents WHERE incident_id = ? "
                "AND fault_class = 'node') AS after_node FROM actions WHERE incident_id = ?",
                [inc["incident_id"], inc["incident_id"]])
        time.sleep(3)
    finally:
        stop.set()
        thread.join()
    assert lost.raylet_pid and detected_s < 60, detected_s
    assert len(moved) == 2 and done["closed_at"]
    assert not [a for a in actions if a["after_node"] or a["status"] in (
        "approved", "executed", "verified", "failed")], actions
    after = [code for t, code in codes if t > time.time() - 2.5]
    assert after and all(c == 200 for c in after), codes[-20:]

"""On the real stack: a canary with injected latency becomes an incident whose top root cause
is that version, fault class latency, with trace and metric evidence."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.config import Settings
from aiops.lifecycle import LifecycleClient
from serve.specs import load_specs
from tests.conftest import running_stack

pytestmark = pytest.mark.stack

MODELS = Path(__file__).resolve().parents[2] / "models-analytics.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with running_stack(tmp_path_factory.mktemp("analytics"), MODELS, analytics_interval_s=1,
                       analytics_window_s=10, ebpf="off") as s:
        yield s


def _specs(tmp: Path, weights: dict[str, int]) -> list[dict[str, Any]]:
    doc = yaml.safe_load(MODELS.read_text())
    base = doc["models"][0]
    doc["models"] = [{**base, "version": v, "traffic": w} for v, w in weights.items()]
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(doc))
    return [s.model_dump(mode="json") for s in load_specs(path)]


class Traffic:
    """Back-to-back chat requests to echo from two clients until stopped."""

    def __init__(self, url: str) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not self.stop.is_set():
                c.post("/v1/chat/completions", json={
                    "model": "echo", "messages": [{"role": "user", "content": "ping"}]})

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _incident(url: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    seen: list[Any] = []
    with httpx.Client(base_url=url, timeout=10) as c:
        while time.monotonic() < deadline:
            seen = c.get("/api/v1/incidents", params={"status": "active"}).json()["incidents"]
            for inc in seen:
                if inc["service"] == "echo" and inc["model_version"] == "v2":
                    detail: dict[str, Any] = c.get(f"/api/v1/incidents/{inc['incident_id']}"
                                                   ).json()
                    return detail
            time.sleep(1)
    raise AssertionError(f"no incident attributed to echo v2 within {timeout_s} s: {seen}")


def test_a_slow_canary_is_the_top_root_cause(stack: Settings, tmp_path: Path) -> None:
    traffic = Traffic(stack.serve_url)
    try:
        time.sleep(15)  # a baseline of v1
        with LifecycleClient.from_settings(stack) as control:
            control.apply(_specs(tmp_path, {"v1": 100, "v2": 0}))
            control.set_faults("echo", "v2", {"latency_ms": 300})
            control.canary("echo", "v2", 30)
            started = time.monotonic()
            incident = _incident(stack.server_url, 60)
            detected_s = time.monotonic() - started
    finally:
        traffic.close()
    assert incident["status"] == "open" and incident["fault_class"] == "latency", incident
    top = incident["evidence"]["root_causes"][0]
    assert (top["service"], top["version"], top["fault_class"]) == ("echo", "v2", "latency")
    kinds = {e["kind"] for e in top["evidence"]}
    assert {"trace", "metric"} <= kinds, top["evidence"]
    context = {c["kind"]: c for c in incident["evidence"]["context"]}
    assert context["metric"]["id"] == "gen_ai.server.request.duration"
    assert context["metric"]["observed"] > 2 * context["metric"]["baseline"]
    assert detected_s < 30

"""Real backends for the dashboards' queries: Debian's Prometheus, started here with the
compose stack's own configuration (deploy/prometheus/prometheus.yml) pointed at the test
stack, and light live traffic so that rates, TTFT and TPOT have something to show.

Without /usr/bin/prometheus (`make install` as root installs it) the PromQL tests skip and say
so, unless AIOPS_REQUIRE_PROMETHEUS=1, where the skip would hide a broken check and fails.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.auth import Role, ensure_credential
from aiops.bench.common import free_port
from aiops.config import Settings

PROMETHEUS_BIN = Path("/usr/bin/prometheus")
COMPOSE_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.yml"
# The compose hosts the test stack stands in for.
COMPOSE_HOSTS = {"aiops:4318": "server", "ray-head:8090": "ray"}
LLM, EMBEDDING = "smollm2-135m-instruct", "minilm-l6-v2"


@dataclass(frozen=True)
class RunningPrometheus:
    url: str

    def query_range(self, expr: str, seconds: float = 90, step: float = 2
                    ) -> list[dict[str, Any]]:
        now = time.time()
        resp = httpx.get(f"{self.url}/api/v1/query_range", params={
            "query": expr, "start": now - seconds, "end": now, "step": step}, timeout=30)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        resp = httpx.get(f"{self.url}/api/v1/label/{label}/values",
                         params={"match[]": match}, timeout=30)
        assert resp.status_code == 200, resp.text
        values: list[str] = resp.json()["data"]
        return values


def prometheus_config(stack: Settings) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its targets pointed at ``stack``."""
    config: dict[str, Any] = yaml.safe_load(COMPOSE_CONFIG.read_text())
    local = {"server": f"127.0.0.1:{stack.server_port}",
             "ray": f"127.0.0.1:{stack.ray_metrics_port}"}
    # Scrape every second so that a rate has points within seconds.
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    # The compose file's scrape credentials, made here as `aiops credentials init` makes them.
    token = stack.data_dir / "credentials" / "prometheus.token"
    ensure_credential(stack.data_dir, "prometheus", Role.VIEWER)
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [local[COMPOSE_HOSTS[t]] for t in static["targets"]]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    return config


@pytest.fixture(scope="session")
def prometheus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[RunningPrometheus]:
    """Prometheus scraping the session's stack (checked for before the stack starts)."""
    if not PROMETHEUS_BIN.exists():
        reason = (f"{PROMETHEUS_BIN} is absent: install Debian's prometheus "
                  "(`make install` as root does)")
        if os.environ.get("AIOPS_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    stack: Settings = request.getfixturevalue("stack")
    tmp = tmp_path_factory.mktemp("prometheus")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(stack)))
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [str(PROMETHEUS_BIN), f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start: "
                                   + (tmp / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        yield RunningPrometheus(url)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


class Traffic:
    """Streaming chat (TTFT, TPOT, tokens), embeddings and a request for an unknown model,
    in a loop until closed, so that every rate has something to show."""

    def __init__(self, serve_url: str) -> None:
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, args=(serve_url,), daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not self.stop.is_set():
                with c.stream("POST", "/v1/chat/completions", json={
                        "model": LLM, "stream": True, "max_tokens": 6,
                        "messages": [{"role": "user", "content": "Say hi."}]}) as r:
                    for _ in r.iter_bytes():
                        pass
                c.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hello"})
                c.post("/v1/chat/completions", json={
                    "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
                self.sent += 1
                self.stop.wait(0.3)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

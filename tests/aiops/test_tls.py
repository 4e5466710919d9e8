"""TLS of the aiops server: a certificate and key make it HTTPS-only, and every client the stack
runs (CLI, OTLP exporters of Serve replicas, the eBPF collector's exporter) verifies it against
the configured CA.

The server is the real ``aiops server`` process; the CA and certificate are trustme's.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx
import pytest
import trustme
from typer.testing import CliRunner

from aiops.cli import app
from aiops.client import ServerClient
from aiops.config import Settings, load_settings
from aiops.errors import ConfigError, StackError
from aiops.stack import settings_env
from aiops.stack import status as stack_status
from aiops.tls import client_verify
from aiops_harness.bench.common import running_server
from aiops_harness.demo import wait_for_trace
from collectors.ebpf.collector import EbpfCollector
from serve.telemetry import Telemetry, TelemetryConfig
from tests.conftest import running_stack

ANALYTICS_MODELS = Path(__file__).resolve().parents[1] / "models-analytics.yaml"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, and a certificate it signed for the loopback address."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    return files


@pytest.fixture(scope="module")
def tls_server(pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[Settings]:
    with running_server(tmp_path_factory.mktemp("tls"), server_tls_cert=pki["cert"],
                        server_tls_key=pki["key"], server_tls_ca=pki["ca"],
                        admin_token="s3cret-admin-token-for-tls") as (settings, _pid):
        yield settings


# Configuration.

def test_a_certificate_makes_the_server_url_https(pki: dict[str, Path]) -> None:
    settings = load_settings(server_tls_cert=pki["cert"], server_tls_key=pki["key"])
    assert settings.server_url.startswith("https://")
    assert load_settings().server_url.startswith("http://")


def test_a_certificate_without_its_key_is_a_configuration_error(pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="server_tls_cert and server_tls_key must be set "
                       "together"):
        load_settings(server_tls_cert=pki["cert"])


def test_a_ca_alone_makes_a_client_of_an_https_server(pki: dict[str, Path]) -> None:
    # A machine that only talks to the server (the CLI elsewhere, an eBPF DaemonSet) needs
    # the CA, not the server's private key ...
    settings = load_settings(server_tls_ca=pki["ca"])
    assert settings.server_url.startswith("https://")
    # ... but the server itself cannot serve HTTPS without its certificate.
    result = CliRunner().invoke(app, ["server"], env=settings_env(settings))
    assert result.exit_code == 2
    assert "AIOPS_SERVER_TLS_CERT" in result.output


def test_a_missing_certificate_file_is_named(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server_tls_key: .*nope\.key is not a readable"):
        load_settings(server_tls_cert=pki["cert"], server_tls_key=tmp_path / "nope.key")


# The running server.

def test_clients_built_from_the_settings_verify_the_server_against_the_ca(
        tls_server: Settings) -> None:
    with ServerClient.of(tls_server) as client:
        assert client.sql("SELECT 42 AS answer")["rows"] == [[42]]


def test_a_client_that_does_not_trust_the_ca_is_refused_with_a_clear_error(
        tls_server: Settings) -> None:
    with ServerClient(tls_server.server_url) as client, \
            pytest.raises(StackError, match="CERTIFICATE_VERIFY_FAILED"):
        client.sql("SELECT 1")


def test_plain_http_is_not_served(tls_server: Settings) -> None:
    plain = tls_server.server_url.replace("https://", "http://")
    # The port is open (not a connect error) but speaks only TLS.
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        httpx.get(f"{plain}/readyz", timeout=5)


def test_mutating_endpoints_still_need_the_admin_token_over_tls(
        tls_server: Settings, pki: dict[str, Path]) -> None:
    url = f"{tls_server.server_url}/api/v1/rollouts"
    body = {"model": "echo", "version": "v2"}
    with httpx.Client(verify=client_verify(tls_server), timeout=10) as c:
        missing = c.post(url, json=body)
        wrong = c.post(url, json=body, headers={"Authorization": "Bearer nope"})
    assert missing.status_code == 401 and "admin role" in missing.json()["error"]
    assert wrong.status_code in (401, 403)


def test_the_cli_reaches_the_server_over_tls(tls_server: Settings) -> None:
    result = CliRunner().invoke(app, ["sql", "SELECT 7 AS n", "--json"],
                                env=settings_env(tls_server))
    assert result.exit_code == 0, result.output
    assert '"rows": [[7]]' in result.output


def test_a_replicas_otlp_exporter_delivers_spans_over_tls(
        tls_server: Settings, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # requests would let this variable replace the configured CA (psf/requests#3829).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    telemetry = Telemetry(TelemetryConfig(tls_server.server_url, 0.2,
                                          certificate_file=str(pki["ca"])),
                          {"service.name": "tls-probe"}, component="tls-test")
    with telemetry.tracer.start_as_current_span("over-tls") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    telemetry.flush()
    telemetry.shutdown()
    with ServerClient.of(tls_server) as db:
        deadline = time.monotonic() + 20
        while not (rows := db.rows("SELECT name FROM spans WHERE trace_id = ?", [trace_id])):
            assert time.monotonic() < deadline, "the span never arrived"
            time.sleep(0.2)
    assert rows == [{"name": "over-tls"}]


def test_the_ebpf_collector_exports_over_tls_with_the_ca_and_not_without(
        tls_server: Settings) -> None:
    with_ca = EbpfCollector(tls_server.server_url, probes=(), verify=client_verify(tls_server))
    without = EbpfCollector(tls_server.server_url, probes=())
    try:
        assert with_ca.cycle() > 0
        assert without.cycle() == 0 and without.stats.export_failures == 1
    finally:
        with_ca.close()
        without.close()
    with ServerClient.of(tls_server) as db:
        rows = db.rows("SELECT count(*) AS n FROM metric_points "
                       "WHERE name = 'aiops.ebpf.collector.cpu_seconds'")
    assert rows[0]["n"] >= 1


# The whole stack.

@pytest.fixture(scope="module")
def tls_stack(pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
              ) -> Iterator[Settings]:
    with running_stack(tmp_path_factory.mktemp("tls-stack") / "data", ANALYTICS_MODELS,
                       analytics=False, server_tls_cert=pki["cert"], server_tls_key=pki["key"],
                       server_tls_ca=pki["ca"], ebpf_interval_s=1) as s:
        yield s


@pytest.mark.stack
def test_the_stack_reports_to_a_tls_server(tls_stack: Settings) -> None:
    """`aiops up` waits for the server over TLS; the ingress's and the replica's spans, logs
    and metrics, and the eBPF collector's metrics where it runs, arrive over TLS."""
    health = {r["component"]: r["healthy"] for r in stack_status(tls_stack)}
    assert health["server"] and health["serve"], health
    trace_id = secrets.token_hex(16)
    resp = httpx.post(f"{tls_stack.serve_url}/v1/chat/completions", timeout=30,
                      headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
                      json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200, resp.text
    with ServerClient.of(tls_stack) as db:
        records = wait_for_trace(db, trace_id, timeout_s=60)
        assert records.complete, records
        assert {s["service_name"] for s in records.spans} >= {"ingress", "echo"}
        if os.environ.get("AIOPS_REQUIRE_EBPF") == "1":
            assert "ebpf" in health, "the eBPF collector did not start (make test as root)"
        if "ebpf" in health:
            deadline = time.monotonic() + 60
            while not db.rows("SELECT 1 FROM metric_points WHERE name LIKE 'aiops.ebpf.%' "
                              "LIMIT 1"):
                assert time.monotonic() < deadline, "no eBPF metric arrived over TLS"
                time.sleep(1)

"""The committed dashboards and provisioning files are what the code generates, and they hang
together: every panel names a provisioned datasource, every Infinity body is valid JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from aiops.store import Store
from dashboards.cli import app
from dashboards.datasources import INFINITY_PLUGIN, SERVER_TOKEN_FILE, datasources
from dashboards.generate import GENERATED, PACKAGE_DIR, PROVISIONING, render
from dashboards.inspect import queries

DASHBOARDS = sorted((PACKAGE_DIR / GENERATED).glob("*.json"))


def test_committed_files_are_exactly_what_generate_writes() -> None:
    # CI's check: a dashboard change is a code change plus `aiops dashboards generate`.
    for rel, text in render().items():
        assert (PACKAGE_DIR / rel).read_text() == text, f"{rel} is stale: run " \
            "`aiops dashboards generate`"
    assert {p.name for p in DASHBOARDS} == {
        f"{uid}.json" for uid in ("aiops-serving", "aiops-canary", "aiops-incidents",
                                  "aiops-ebpf", "aiops-pipeline", "aiops-slo")}


def test_generate_and_check_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["generate", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.*")) == sorted(render())
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 0 and "current" in result.output


def test_a_private_ca_goes_into_generated_provisioning_but_never_the_package(
        tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["generate", "--server-ca", str(ca)])
    assert refused.exit_code == 2 and "--out DIR" in refused.output
    out = tmp_path / "out"
    result = runner.invoke(app, ["generate", "--server-url", "https://aiops:4318",
                                 "--server-ca", str(ca), "--out", str(out)])
    assert result.exit_code == 0, result.output
    api = next(d for d in yaml.safe_load(
        (out / PROVISIONING / "datasources" / "aiops.yaml").read_text())["datasources"]
        if d["type"] == INFINITY_PLUGIN)
    assert api["jsonData"]["tlsAuthWithCACert"] is True
    assert api["secureJsonData"]["tlsCACert"] == ca.read_text()
    assert api["jsonData"]["auth_method"] == "bearerToken"  # the CA and the token together


def test_the_api_datasource_reads_its_bearer_token_from_a_file() -> None:
    # The server wants a token beyond loopback; the committed file names the file Grafana
    # reads it from (written by `aiops credentials init`), never a token.
    provisioned = yaml.safe_load(
        (PACKAGE_DIR / PROVISIONING / "datasources" / "aiops.yaml").read_text())
    api = next(d for d in provisioned["datasources"] if d["type"] == INFINITY_PLUGIN)
    assert api["jsonData"]["auth_method"] == "bearerToken"
    assert api["secureJsonData"] == {"bearerToken": f"$__file{{{SERVER_TOKEN_FILE}}}"}
    assert datasources("http://p:9090", "http://a:4318")[1].get("secureJsonData") is None


def test_every_query_names_a_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(
        (PACKAGE_DIR / PROVISIONING / "datasources" / "aiops.yaml").read_text())
    by_uid = {d["uid"]: d for d in provisioned["datasources"]}
    assert by_uid["aiops-api"]["type"] == INFINITY_PLUGIN
    assert by_uid["aiops-prometheus"]["type"] == "prometheus"
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for q in queries(doc):
            assert q.datasource in by_uid, f"{path.name} {q.where}"


def test_infinity_bodies_are_json_once_grafana_fills_in_the_range() -> None:
    for path in DASHBOARDS:
        for q in queries(json.loads(path.read_text())):
            if not q.is_infinity or q.target["url_options"]["method"] != "POST":
                continue
            body = json.loads(q.target["url_options"]["data"]
                              .replace("${__from}", "1").replace("${__to}", "2"))
            assert body["params"][:2] == [1, 2], q.where
            assert body["sql"].lstrip().upper().startswith(("SELECT", "WITH")), q.where


def test_slo_objectives_come_from_the_model_specs(tmp_path: Path) -> None:
    specs = tmp_path / "models.yaml"
    specs.write_text(yaml.safe_dump({"models": [{
        "name": "tiny", "version": "v1", "backend": "echo", "model_type": "llm",
        "qos": {"slo": {"p99_ms": 123, "error_rate": 0.02}}}]}))
    slo = render(models_file=specs)[f"{GENERATED}/aiops-slo.json"]
    assert "('tiny', 123.0, 0.01, 0.02)" in slo
    assert "smollm2" not in slo


def test_all_servers_panels_read_every_servers_tables_and_run(tmp_path: Path) -> None:
    """`generate --all-servers`: every telemetry table a panel names is `<table>_all` (with a
    lake, every server's rows), and every such statement runs on a store."""
    files = render(every_server=True)
    store = Store(tmp_path / "telemetry.duckdb")
    ran = 0
    try:
        for name, text in files.items():
            if not name.endswith(".json"):
                continue
            for q in queries(json.loads(text)):
                if not q.is_infinity or q.target["url_options"]["method"] != "POST":
                    continue
                data = q.target["url_options"]["data"]
                body = json.loads(data.replace("${__from}", "0").replace("${__to}", "1"))
                sql = body["sql"]
                assert not re.search(r"\b(FROM|JOIN)\s+(spans|logs|metric_points)\b(?!_)",
                                     sql), q.where
                if "_all" in sql:
                    store.query(sql, ["x" if p == "$model" else p for p in body["params"]])
                    ran += 1
    finally:
        store.close()
    assert ran > 10


def test_all_servers_dashboards_are_never_written_into_the_package() -> None:
    result = CliRunner().invoke(app, ["generate", "--all-servers"])
    assert result.exit_code == 2 and "--out" in result.output

"""`aiops dashboards push` through grafana-client. Grafana itself cannot be installed on this
machine, so a small HTTP app answers the few Grafana API routes the push uses, with Grafana's
status codes (404 for what does not exist yet), on a real loopback port."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from aiops_harness.bench.common import free_port
from dashboards.cli import app


class GrafanaStandIn:
    def __init__(self) -> None:
        self.datasources: dict[str, dict[str, Any]] = {}
        self.folders: set[str] = set()
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.tokens: set[str] = set()
        self.app = FastAPI()
        a = self.app

        @a.middleware("http")
        async def record(request: Request, call_next: Any) -> Any:
            self.calls.append(f"{request.method} {request.url.path}")
            self.tokens.add(request.headers.get("authorization", ""))
            return await call_next(request)

        @a.get("/api/datasources/uid/{uid}")
        async def get_ds(uid: str) -> JSONResponse:
            if uid not in self.datasources:
                return JSONResponse({"message": "Data source not found"}, status_code=404)
            return JSONResponse(self.datasources[uid])

        @a.post("/api/datasources")
        async def create_ds(request: Request) -> JSONResponse:
            body = await request.json()
            self.datasources[body["uid"]] = body
            return JSONResponse({"message": "Datasource added"})

        @a.put("/api/datasources/uid/{uid}")
        async def update_ds(uid: str, request: Request) -> JSONResponse:
            self.datasources[uid] = await request.json()
            return JSONResponse({"message": "Datasource updated"})

        @a.get("/api/folders/{uid}")
        async def get_folder(uid: str) -> JSONResponse:
            if uid not in self.folders:
                return JSONResponse({"message": "folder not found"}, status_code=404)
            return JSONResponse({"uid": uid})

        @a.post("/api/folders")
        async def create_folder(request: Request) -> JSONResponse:
            self.folders.add((await request.json())["uid"])
            return JSONResponse({"uid": "aiops"})

        @a.post("/api/dashboards/db")
        async def save(request: Request) -> JSONResponse:
            body = await request.json()
            if body.get("folderUid") not in self.folders:
                return JSONResponse({"message": "folder not found"}, status_code=400)
            self.dashboards[body["dashboard"]["uid"]] = body
            return JSONResponse({"status": "success", "uid": body["dashboard"]["uid"]})


@pytest.fixture
def grafana() -> Iterator[tuple[str, GrafanaStandIn]]:
    stand_in = GrafanaStandIn()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(stand_in.app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", stand_in
    server.should_exit = True
    thread.join(timeout=10)


def test_push_creates_then_updates_datasources_and_saves_every_dashboard(
    grafana: tuple[str, GrafanaStandIn],
) -> None:
    url, g = grafana
    runner = CliRunner()
    for _ in range(2):  # a second push updates what the first created
        result = runner.invoke(app, ["push", "--url", url, "--token", "s3cret",
                                     "--server-url", "http://aiops.example:4318"])
        assert result.exit_code == 0, result.output
        assert "pushed 6 dashboard(s) and 2 datasource(s)" in result.output
    assert g.tokens == {"Bearer s3cret"}
    assert g.calls.count("POST /api/datasources") == 2  # created once each
    assert g.calls.count("PUT /api/datasources/uid/aiops-api") == 1
    assert g.calls.count("POST /api/folders") == 1
    assert g.datasources["aiops-api"]["url"] == "http://aiops.example:4318"
    assert set(g.dashboards) == {"aiops-serving", "aiops-canary", "aiops-incidents",
                                 "aiops-ebpf", "aiops-pipeline", "aiops-slo"}
    saved = g.dashboards["aiops-serving"]
    assert saved["overwrite"] is True and saved["folderUid"] == "aiops"
    assert saved["dashboard"]["id"] is None and json.dumps(saved["dashboard"])


def test_an_https_server_with_a_private_ca_gets_it_in_the_api_datasource(
    grafana: tuple[str, GrafanaStandIn], tmp_path: Path,
) -> None:
    url, g = grafana
    pem = trustme.CA().cert_pem.bytes().decode()
    (tmp_path / "ca.pem").write_text(pem)
    result = CliRunner().invoke(app, [
        "push", "--url", url, "--token", "t", "--server-url", "https://aiops.example:4318",
        "--server-ca", str(tmp_path / "ca.pem")])
    assert result.exit_code == 0, result.output
    api = g.datasources["aiops-api"]
    assert api["jsonData"]["tlsAuthWithCACert"] is True
    assert api["secureJsonData"]["tlsCACert"] == pem
    assert "secureJsonData" not in g.datasources["aiops-prometheus"]


def test_a_viewer_token_for_a_server_beyond_loopback_goes_into_the_api_datasource(
    grafana: tuple[str, GrafanaStandIn],
) -> None:
    url, g = grafana
    result = CliRunner().invoke(app, [
        "push", "--url", url, "--token", "t", "--server-url", "http://aiops.example:4318",
        "--server-token", "aiops_viewer-token-for-grafana"])
    assert result.exit_code == 0, result.output
    api = g.datasources["aiops-api"]
    assert api["secureJsonData"]["bearerToken"] == "aiops_viewer-token-for-grafana"
    assert "aiops_viewer" not in result.output


def test_a_missing_ca_file_is_refused_before_anything_is_pushed(
    grafana: tuple[str, GrafanaStandIn], tmp_path: Path,
) -> None:
    url, g = grafana
    result = CliRunner().invoke(app, ["push", "--url", url, "--server-ca",
                                      str(tmp_path / "nope.pem")])
    assert result.exit_code == 2 and "nope.pem" in result.output
    assert g.calls == []


def test_a_ca_without_the_datasources_to_carry_it_is_refused(
    grafana: tuple[str, GrafanaStandIn], tmp_path: Path,
) -> None:
    url, g = grafana
    (tmp_path / "ca.pem").write_text(trustme.CA().cert_pem.bytes().decode())
    result = CliRunner().invoke(app, ["push", "--url", url, "--no-datasources",
                                      "--server-ca", str(tmp_path / "ca.pem")])
    assert result.exit_code == 2 and "needs --datasources" in result.output
    assert g.calls == []


def test_push_says_why_when_grafana_refuses(grafana: tuple[str, GrafanaStandIn]) -> None:
    url, _ = grafana
    result = CliRunner().invoke(app, ["push", "--url", f"{url}/nowhere", "--token", "x",
                                      "--no-datasources"])
    assert result.exit_code == 1
    assert "refused the push: 404" in result.output

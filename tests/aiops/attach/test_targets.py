"""Attach targets: validated where they are written (config file or `aiops attach add`),
names unique, tokens read from files when used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from typer.testing import CliRunner

from aiops.attach.ray_serve import Deployment, ServeApp, discover
from aiops.attach.watch import (
    Attachment,
    AttachSettings,
    load_managed,
    model_tag,
    save_managed,
    scrape_target,
    targets_of,
)
from aiops.cli import app
from aiops.config import AttachTarget, load_settings
from aiops.errors import ConfigError
from collectors.ebpf.attribution import ATTACHED_REPLICAS_FILE
from tests.loopback import serving


def _t(name: str, kind: str = "ray", **kw: object) -> AttachTarget:
    return AttachTarget.model_validate({"kind": kind, "name": name,
                                        "url": "http://127.0.0.1:8265", **kw})


@pytest.mark.parametrize("bad", [{"kind": "k8s"}, {"name": "Bad Name"},
                                 {"url": "ftp://x"}, {"url": "http://a b"},
                                 {"metrics_url": "nope"}, {"extra": 1}])
def test_a_malformed_target_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AttachTarget.model_validate({"kind": "ray", "name": "ok",
                                     "url": "http://127.0.0.1:8265", **bad})


def test_config_and_managed_targets_are_merged_and_names_must_be_unique(tmp_path: Path
                                                                        ) -> None:
    settings = load_settings(data_dir=tmp_path, attach=(_t("a"),))
    save_managed(tmp_path, [_t("b", "vllm")])
    assert [t.name for t in targets_of(settings)] == ["a", "b"]
    save_managed(tmp_path, [_t("a")])
    with pytest.raises(ConfigError, match="two attach targets are named a"):
        targets_of(settings)


def test_a_broken_managed_file_names_the_problem(tmp_path: Path) -> None:
    (tmp_path / "attach.json").write_text('[{"kind": "ray", "name": "x"}]')
    with pytest.raises(ConfigError, match=r"attach\.json: Field required at 0\.url"):
        load_managed(tmp_path)


def test_tokens_are_read_from_their_file_and_an_empty_one_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s3cret\n")
    assert _t("a", token_file=tmp_path / "tok").token() == "s3cret"
    (tmp_path / "tok").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        _t("a", token_file=tmp_path / "tok").token()
    with pytest.raises(ConfigError, match="cannot read token file"):
        _t("a", token_file=tmp_path / "missing").token()


def test_vllm_metrics_default_to_its_metrics_path_and_ray_needs_its_export_port() -> None:
    vllm = scrape_target(_t("v", "vllm"), version="SmolLM2-135M")
    assert vllm is not None and vllm.url == "http://127.0.0.1:8265/metrics"
    assert (vllm.kind, vllm.version) == ("vllm", "SmolLM2-135M")
    assert scrape_target(_t("r")) is None
    ray = scrape_target(_t("r", metrics_url="http://127.0.0.1:8080/metrics"))
    assert ray is not None and ray.job == "r"


def test_the_cli_refuses_bad_input_and_unreachable_targets_and_keeps_nothing(
        tmp_path: Path) -> None:
    env = {"AIOPS_DATA_DIR": str(tmp_path)}
    bad = CliRunner().invoke(app, ["attach", "add", "rayy", "x", "http://127.0.0.1:1"],
                             env=env)
    assert bad.exit_code == 2 and "kind" in bad.output
    down = CliRunner().invoke(app, ["attach", "add", "ray", "x", "http://127.0.0.1:1"], env=env)
    assert down.exit_code == 1 and "cannot reach Ray's dashboard" in down.output
    assert not (tmp_path / "attach.json").exists()
    kept = CliRunner().invoke(app, ["attach", "add", "vllm", "v", "http://127.0.0.1:1",
                                    "--no-check"], env=env)
    assert kept.exit_code == 0, kept.output
    listed = CliRunner().invoke(app, ["attach", "list"], env=env)
    assert "attach.json" in listed.output
    assert CliRunner().invoke(app, ["attach", "remove", "v"], env=env).exit_code == 0
    gone = CliRunner().invoke(app, ["attach", "remove", "v"], env=env)
    assert gone.exit_code == 1 and "not in attach.json" in gone.output


def test_attach_targets_reach_child_processes_through_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiops.stack import settings_env

    settings = load_settings(data_dir=tmp_path, attach=(_t("a"), _t("b", "vllm")))
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    assert load_settings().attach == settings.attach


def test_a_vllm_models_version_is_the_tag_of_the_weights_it_loaded() -> None:
    assert model_tag("/models/Llama-3.1-8B-Instruct-v2/") == "Llama-3.1-8B-Instruct-v2"
    assert model_tag("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert model_tag("plain") == "plain"


def test_a_removed_targets_replicas_and_calls_go_with_it(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: reads fail, are logged, and go on
    save_managed(tmp_path, [_t("r", url=dead)])
    attachment = Attachment(AttachSettings.of(load_settings(data_dir=tmp_path)))
    # What an earlier round read off the cluster: one app with a running replica.
    attachment.apps["r"] = [ServeApp("greeter", "greeter", "1", "RUNNING", None, (
        Deployment("Greeter", "HEALTHY", ("r1",), 1, None, (("r1", 4242, "127.0.0.1"),)),))]
    attachment.read_once()
    rows = json.loads((tmp_path / ATTACHED_REPLICAS_FILE).read_text())
    assert [(r["replica"], r["pid"]) for r in rows] == [("r1", 4242)]
    assert "r" in attachment.errors
    save_managed(tmp_path, [])
    os.utime(tmp_path / "attach.json", (1, 1))  # a new mtime, whatever the clock's resolution
    attachment.read_once()
    assert json.loads((tmp_path / ATTACHED_REPLICAS_FILE).read_text()) == []
    assert attachment.apps == {} and attachment.errors == {}


def _dashboard(details: dict[str, object]) -> FastAPI:
    """Ray's dashboard as `aiops attach check` reads it: the Serve REST API's GET."""
    dash = FastAPI()

    @dash.get("/api/serve/applications/")
    async def applications() -> dict[str, object]:
        return details

    return dash


def test_attach_check_shows_service_and_version_whole_in_80_columns(tmp_path: Path) -> None:
    app_name = "recommendations-eu-west"
    config = {"name": app_name, "import_path": "shop:shop", "route_prefix": "/",
              "deployments": [{"name": "Ingress"}, {"name": "RecommendationScorer"}]}
    deployments = {name: {"status": "HEALTHY", "deployment_config": {"name": name},
                          "replicas": [{"replica_id": f"{name}-1", "state": "RUNNING"}]}
                   for name in ("Ingress", "RecommendationScorer")}
    details: dict[str, object] = {"applications": {
        app_name: {"status": "RUNNING", "deployed_app_config": config,
                   "deployments": deployments, "deployment_topology": {"nodes": {
                       "Ingress": {"is_ingress": True}}}},
        "adhoc-imperative-app": {"status": "DEPLOYING", "deployed_app_config": None,
                                 "deployments": {}}}}
    apps = {a.name: a for a in discover(details)}
    scorer = apps[app_name]
    service, version = scorer.service_of("RecommendationScorer"), scorer.version
    assert service == f"{app_name}.RecommendationScorer" and len(service) == 44
    assert version.startswith("cfg-") and len(version) == 12
    with serving(_dashboard(details)) as url:
        save_managed(tmp_path, [_t("team-ray", url=url)])
        result = CliRunner().invoke(app, ["attach", "check"],
                                    env={"AIOPS_DATA_DIR": str(tmp_path), "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    # Each whole on one line: service and version as incidents, the policy and chat-ops name
    # them (`shop.Scorer@cfg-1a2b3c4d`), to be copied from here.
    row = next(line for line in lines if service in line)
    assert version in row
    assert any(app_name in line and version in line and "Ingress" in line for line in lines)
    assert any(line.split() == ["application", app_name, "RUNNING"] for line in lines)
    assert any("adhoc-imperative-app" in line and "imperative" in line for line in lines)
    assert sum(line.strip() == "HEALTHY, 1 replica" for line in lines) == 2
    assert "…" not in result.output  # nothing shortened

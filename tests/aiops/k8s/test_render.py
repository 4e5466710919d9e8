"""`aiops k8s render`: a KubeRay RayService from the model specs that KubeRay's schema and Ray
Serve's own config schema accept, plus the server and the eBPF DaemonSet."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema
from typer.testing import CliRunner

from aiops.k8s.cli import app
from aiops.k8s.lint import lint_documents, rayservice_schema
from aiops.k8s.render import RenderOptions, render
from serve.specs import load_specs

MODELS = Path(__file__).resolve().parents[2] / "models-test.yaml"


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return render(load_specs(MODELS), MODELS.read_text())


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def test_the_rayservice_validates_against_the_kuberay_crd_schema(
    manifests: list[dict[str, Any]],
) -> None:
    rayservice = _one(manifests, "RayService")
    jsonschema.Draft202012Validator(rayservice_schema()).validate(rayservice)


def test_the_vendored_schema_rejects_what_kuberay_would(manifests: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(_one(manifests, "RayService"))
    del broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    broken["spec"]["rayClusterConfig"]["rayVersoin"] = "2.60.0"
    errors = {"/".join(map(str, e.absolute_path)): e.message for e in
              jsonschema.Draft202012Validator(rayservice_schema()).iter_errors(broken)}
    assert set(errors) == {"spec/rayClusterConfig/workerGroupSpecs/0",
                           "spec/rayClusterConfig/headGroupSpec/rayStartParams/num-cpus",
                           "spec/rayClusterConfig"}
    assert "'groupName' is a required property" in errors["spec/rayClusterConfig/"
                                                          "workerGroupSpecs/0"]


def test_serve_config_is_what_aiops_up_deploys_and_ray_accepts_it(
    manifests: list[dict[str, Any]],
) -> None:
    config = yaml.safe_load(_one(manifests, "RayService")["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(config)  # Ray Serve's own schema for `serve deploy`
    apps = {a["name"]: a for a in config["applications"]}
    assert set(apps) == {"aiops", "smollm2-135m-instruct-v1", "minilm-l6-v2-v1", "ppocr-v4-v1"}
    assert apps["aiops"]["route_prefix"] == "/"
    assert apps["minilm-l6-v2-v1"]["args"]["telemetry"]["endpoint"] == \
        "http://aiops-server.aiops.svc:4318"
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000}


def test_worker_group_bounds_follow_the_specs_autoscaling(tmp_path: Path) -> None:
    specs = tmp_path / "models.yaml"
    specs.write_text(yaml.safe_dump({"models": [{
        "name": "echo", "version": "v1", "backend": "echo", "model_type": "llm",
        "resources": {"num_cpus": 1}, "autoscaling": {"min_replicas": 2, "max_replicas": 9}}]}))
    docs = render(load_specs(specs), specs.read_text(), RenderOptions(worker_cpus=4))
    [group] = _one(docs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # 2 x 1 CPU + the ingress's 0.1 -> 1 worker of 4; 9 x 1 + 0.1 -> 3 workers.
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 1, 3)


def test_rendered_manifests_pass_lint_and_only_the_ebpf_daemonset_is_privileged(
    manifests: list[dict[str, Any]],
) -> None:
    assert lint_documents(manifests) == []
    privileged = [d["metadata"]["name"] for d in manifests
                  if "privileged: true" in yaml.safe_dump(d)]
    assert privileged == ["aiops-ebpf"]
    server = _one(manifests, "Deployment")["spec"]
    assert server["replicas"] == 1 and server["strategy"] == {"type": "Recreate"}
    no_ebpf = render(load_specs(MODELS), MODELS.read_text(), RenderOptions(ebpf=False))
    assert "DaemonSet" not in {d["kind"] for d in no_ebpf}


def test_render_then_lint_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "aiops.yaml"
    runner = CliRunner()
    result = runner.invoke(app, ["render", "--models", str(MODELS), "--image",
                                 "registry.example/aiops:1.2.3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "PersistentVolumeClaim", "Deployment",
                                         "Service", "RayService", "DaemonSet"]
    assert "registry.example/aiops:1.2.3" in out.read_text()
    result = runner.invoke(app, ["lint", str(out)])
    assert result.exit_code == 0 and "no findings" in result.output

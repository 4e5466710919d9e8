"""`aiops k8s render`: a KubeRay RayService from the model specs that KubeRay's schema and Ray
Serve's own config schema accept, plus the server, the eBPF DaemonSet, the NetworkPolicies and
the credentials Secret (generated once into a credentials directory, never hard-coded, the
only place a secret is written; tests/security/test_k8s.py holds the security rules)."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema
from typer.testing import CliRunner

from aiops.auth import Role, TokenStore
from aiops.k8s.cli import app
from aiops.k8s.lint import lint_documents, rayservice_schema
from aiops.k8s.render import RenderOptions, StackCredentials, render
from serve.specs import load_specs
from serve.telemetry import TelemetryConfig

MODELS = Path(__file__).resolve().parents[2] / "models-test.yaml"


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> StackCredentials:
    return StackCredentials.load(tmp_path_factory.mktemp("credentials"))


@pytest.fixture(scope="module")
def manifests(credentials: StackCredentials) -> list[dict[str, Any]]:
    return render(load_specs(MODELS), MODELS.read_text(), credentials=credentials)


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


def _mounted(tmp_path: Path, manifests: list[dict[str, Any]]) -> Path:
    """The Secret as the pods see it mounted: one file per key."""
    mounted = tmp_path / "secret"
    mounted.mkdir()
    for key, value in _one(manifests, "Secret")["stringData"].items():
        (mounted / key).write_text(value + "\n")
    return mounted


def _remount(node: Any, mounted: Path) -> Any:
    """``node`` with the pods' Secret mount path replaced by ``mounted``."""
    if isinstance(node, dict):
        return {k: _remount(v, mounted) for k, v in node.items()}
    if isinstance(node, list):
        return [_remount(v, mounted) for v in node]
    if isinstance(node, str) and node.startswith("/etc/aiops-credentials/"):
        return str(mounted / node.rsplit("/", 1)[1])
    return node


def test_the_openai_endpoints_require_the_generated_api_key_and_replicas_send_their_token(
    tmp_path: Path, manifests: list[dict[str, Any]], credentials: StackCredentials,
) -> None:
    """Each application's builder (named by serveConfigV2) reads the mounted Secret and builds
    what serve.app builds: the ingress with the API key, every exporter with the `serve`
    ingest token (the server, beyond loopback, refuses anonymous telemetry)."""
    config = yaml.safe_load(_one(manifests, "RayService")["spec"]["serveConfigV2"])
    mounted = _mounted(tmp_path, manifests)
    assert len(credentials.openai_api_key) >= 32
    tokens = {}
    for application in config["applications"]:
        module, name = application["import_path"].split(":")
        builder = getattr(importlib.import_module(module), name)
        bound = builder(_remount(application["args"], mounted))._bound_deployment.init_args
        if application["name"] == "aiops":
            assert bound[0]["api_keys"] == [credentials.openai_api_key]
            telemetry = bound[0]["telemetry"]
        else:
            telemetry = bound[1]
        tokens[application["name"]] = TelemetryConfig(**telemetry).token
    assert tokens == {a["name"]: credentials.serve for a in config["applications"]}


def test_a_missing_or_empty_secret_file_fails_the_build_instead_of_opening_the_endpoints(
    tmp_path: Path, manifests: list[dict[str, Any]],
) -> None:
    from aiops.k8s.serve_apps import resolve_ingress_args

    config = yaml.safe_load(_one(manifests, "RayService")["spec"]["serveConfigV2"])
    [ingress] = [a for a in config["applications"] if a["name"] == "aiops"]
    mounted = _mounted(tmp_path, manifests)
    (mounted / "openai-api.key").write_text("\n")
    with pytest.raises(RuntimeError, match=r"openai-api\.key is empty"):
        resolve_ingress_args(_remount(ingress["args"], mounted))
    (mounted / "openai-api.key").unlink()
    with pytest.raises(RuntimeError, match="cannot be read"):
        resolve_ingress_args(_remount(ingress["args"], mounted))


def test_the_secret_is_generated_once_and_reused(tmp_path: Path) -> None:
    first = StackCredentials.load(tmp_path / "creds")
    assert StackCredentials.load(tmp_path / "creds") == first  # a re-render rotates nothing
    other = StackCredentials.load(tmp_path / "elsewhere")
    assert {first.admin, first.serve, first.ebpf, first.openai_api_key}.isdisjoint(
        {other.admin, other.serve, other.ebpf, other.openai_api_key})
    docs = render(load_specs(MODELS), MODELS.read_text(), credentials=first)
    secret = _one(docs, "Secret")
    assert secret["metadata"]["name"] == "aiops-credentials"
    assert secret["stringData"] == {"admin.token": first.admin, "serve.token": first.serve,
                                    "ebpf.token": first.ebpf,
                                    "openai-api.key": first.openai_api_key}
    # No secret value anywhere but the Secret.
    for doc in docs:
        if doc["kind"] != "Secret":
            text = yaml.safe_dump(doc)
            assert not any(v in text for v in secret["stringData"].values()), doc["kind"]


def _pod(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, kind)["spec"]["template"]["spec"]
    return spec


def _secret_keys(pod: dict[str, Any]) -> list[str]:
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "aiops-credentials"
    return [i["key"] for i in volume["secret"]["items"]]


def test_each_component_gets_only_its_own_credentials(manifests: list[dict[str, Any]]) -> None:
    server = _pod(manifests, "Deployment")
    assert sorted(_secret_keys(server)) == ["admin.token", "ebpf.token", "openai-api.key",
                                            "serve.token"]
    [init] = server["initContainers"]
    assert init["command"][:3] == ["aiops", "credentials", "init"]
    source = init["command"][init["command"].index("--from") + 1]
    assert {"name": "credentials", "mountPath": source, "readOnly": True} in \
        init["volumeMounts"]
    env = {e["name"]: e for e in server["containers"][0]["env"]}
    assert env["AIOPS_SERVER_HOST"]["value"] == "0.0.0.0"  # beyond loopback: tokens required
    assert env["AIOPS_AGENT_LLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "aiops-credentials", "key": "openai-api.key"}
    rayservice = _one(manifests, "RayService")["spec"]
    cluster = rayservice["rayClusterConfig"]
    ray_pods = [cluster["headGroupSpec"]["template"]["spec"],
                *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]
    # The Ray pods (where Serve builds the applications and runs the replicas) mount the
    # `serve` token and the API key, where serveConfigV2 says they are read from.
    config = rayservice["serveConfigV2"]
    for pod in ray_pods:
        assert _secret_keys(pod) == ["serve.token", "openai-api.key"]
        assert pod["securityContext"] == {"fsGroup": 10001}  # the image's user reads them
        [mount] = pod["containers"][0]["volumeMounts"]
        assert mount == {"name": "credentials", "mountPath": "/etc/aiops-credentials",
                         "readOnly": True}
        for key in _secret_keys(pod):
            assert f"{mount['mountPath']}/{key}" in config
    ebpf = _pod(manifests, "DaemonSet")
    assert _secret_keys(ebpf) == ["ebpf.token"]
    [container] = ebpf["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    # Where the collector reads its ingest token: <data_dir>/credentials/ebpf.token.
    assert mounts[f"{env['AIOPS_DATA_DIR']}/credentials"]["name"] == "credentials"


def test_the_server_adopts_the_secret_and_registers_its_tokens(
    tmp_path: Path, manifests: list[dict[str, Any]], credentials: StackCredentials,
) -> None:
    mounted = _mounted(tmp_path, manifests)
    data = tmp_path / "data"
    [init] = _pod(manifests, "Deployment")["initContainers"]
    args = [str(mounted) if a.startswith("/etc/") else a for a in init["command"][1:]]
    from aiops.cli import app as aiops_app

    result = CliRunner().invoke(aiops_app, [*args, "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    store = TokenStore(data / "tokens.json")
    serve, ebpf = store.lookup(credentials.serve), store.lookup(credentials.ebpf)
    assert serve is not None and serve.ingest and serve.provenance and serve.role is None
    assert ebpf is not None and ebpf.ingest and not ebpf.provenance
    assert (data / "admin.token").read_text() == credentials.admin
    assert not any(v in result.output for v in (credentials.admin, credentials.serve))


def test_worker_group_bounds_follow_the_specs_autoscaling(
    tmp_path: Path, credentials: StackCredentials,
) -> None:
    specs = tmp_path / "models.yaml"
    specs.write_text(yaml.safe_dump({"models": [{
        "name": "echo", "version": "v1", "backend": "echo", "model_type": "llm",
        "resources": {"num_cpus": 1}, "autoscaling": {"min_replicas": 2, "max_replicas": 9}}]}))
    docs = render(load_specs(specs), specs.read_text(), RenderOptions(worker_cpus=4),
                  credentials=credentials)
    [group] = _one(docs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # 2 x 1 CPU + the ingress's 0.1 -> 1 worker of 4; 9 x 1 + 0.1 -> 3 workers.
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 1, 3)


def test_rendered_manifests_pass_lint_and_only_the_ebpf_daemonset_is_privileged(
    manifests: list[dict[str, Any]], credentials: StackCredentials,
) -> None:
    assert lint_documents(manifests) == []
    privileged = [d["metadata"]["name"] for d in manifests
                  if "privileged: true" in yaml.safe_dump(d)]
    assert privileged == ["aiops-ebpf"]
    server = _one(manifests, "Deployment")["spec"]
    assert server["replicas"] == 1 and server["strategy"] == {"type": "Recreate"}
    no_ebpf = render(load_specs(MODELS), MODELS.read_text(), RenderOptions(ebpf=False),
                     credentials=credentials)
    assert "DaemonSet" not in {d["kind"] for d in no_ebpf}


def test_render_then_lint_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "aiops.yaml"
    runner = CliRunner()
    refused = runner.invoke(app, ["render", "--models", str(MODELS)])
    assert refused.exit_code == 2 and "--credentials" in refused.output
    result = runner.invoke(app, ["render", "--models", str(MODELS), "--image",
                                 "registry.example/aiops:1.2.3", "--credentials",
                                 str(tmp_path / "creds"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["Secret", *["NetworkPolicy"] * 4, "ConfigMap",
                                         "PersistentVolumeClaim", "Deployment", "Service",
                                         "RayService", "DaemonSet"]
    assert "registry.example/aiops:1.2.3" in out.read_text()
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the Secret
    token = TokenStore(tmp_path / "creds" / "tokens.json").lookup(
        (tmp_path / "creds" / "credentials" / "serve.token").read_text())
    assert token is not None and token.ingest and token.role is not Role.ADMIN
    result = runner.invoke(app, ["lint", str(out)])
    assert result.exit_code == 0 and "no findings" in result.output


def test_without_the_secret_the_render_needs_no_credentials_and_references_the_same_keys(
    tmp_path: Path, manifests: list[dict[str, Any]],
) -> None:
    runner = CliRunner()
    out = tmp_path / "aiops.yaml"
    result = runner.invoke(app, ["render", "--models", str(MODELS), "--no-secret",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert "Secret" not in {d["kind"] for d in docs}
    # The same objects as with the Secret, which they reference by name and keys.
    assert docs == [d for d in manifests if d["kind"] != "Secret"]
    assert runner.invoke(app, ["lint", str(out)]).exit_code == 0


def test_the_options_reach_the_manifests(credentials: StackCredentials) -> None:
    docs = render(load_specs(MODELS), MODELS.read_text(),
                  RenderOptions(ray_auth=False, operator_namespace="kuberay-system",
                                serve_from=("10.0.0.0/8",)), credentials=credentials)
    assert "authOptions" not in _one(docs, "RayService")["spec"]["rayClusterConfig"]
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    [operator] = policies["aiops-ray-dashboard"]["ingress"][0]["from"]
    assert operator["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}
    serve = [r for r in policies["aiops-ray"]["ingress"] if r.get("ports") == [
        {"protocol": "TCP", "port": 8000}]]
    # Those CIDRs, the server's agent and the operator (its check of the head's proxy).
    assert [p for r in serve for p in r["from"]] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "aiops",
                                         "app.kubernetes.io/component": "server"}}},
        operator, {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert lint_documents(docs) == []

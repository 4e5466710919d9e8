"""Kubernetes (`aiops k8s render|lint`): no secret in clear outside a Secret, the Ray cluster
fenced by NetworkPolicies and guarded by Ray's token authentication, and a lint that refuses
manifests doing otherwise.

What this replaces: the RayService's `serveConfigV2` carried the `serve` ingest token (once per
application) and the OpenAI API key in clear; no NetworkPolicy fenced the Ray head, whose
dashboard binds 0.0.0.0 next to the GCS (6379) and client (10001) ports; Ray ran without
authentication; and `aiops k8s lint` passed all of it. No cluster runs here: the policies are
read as Kubernetes applies them (which peers each rule admits to which port of which pod),
against the labels the rendered pods carry.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from aiops.k8s.lint import lint, lint_documents
from aiops.k8s.render import StackCredentials, render
from serve.specs import load_specs

MODELS = Path(__file__).resolve().parents[1] / "models-test.yaml"
MOUNT = "/etc/aiops-credentials"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)
EVERYONE = "every source"
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> StackCredentials:
    return StackCredentials.load(tmp_path_factory.mktemp("credentials"))


@pytest.fixture(scope="module")
def manifests(credentials: StackCredentials) -> list[Doc]:
    return render(load_specs(MODELS), MODELS.read_text(), credentials=credentials)


def _one(docs: list[Doc], kind: str) -> Doc:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def _cluster(docs: list[Doc]) -> Doc:
    cluster: Doc = _one(docs, "RayService")["spec"]["rayClusterConfig"]
    return cluster


def _pods(docs: list[Doc]) -> dict[str, Doc]:
    """Every rendered pod template by component: server, ebpf, ray-head, ray-worker."""
    cluster = _cluster(docs)
    templates = [_one(docs, "Deployment")["spec"]["template"],
                 _one(docs, "DaemonSet")["spec"]["template"],
                 cluster["headGroupSpec"]["template"],
                 *(g["template"] for g in cluster["workerGroupSpecs"])]
    return {t["metadata"]["labels"]["app.kubernetes.io/component"]: t for t in templates}


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e  # the only operator the render uses
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _admitted(docs: list[Doc], labels: dict[str, str], port: int) -> list[Any]:
    """The peers the NetworkPolicies admit to ``port`` of a pod with ``labels``
    (``EVERYONE`` for a rule without ``from``); None when no policy fences the pod."""
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"
                and "Ingress" in d["spec"]["policyTypes"]
                and _selects(d["spec"]["podSelector"], labels)]
    assert policies, f"no NetworkPolicy fences {labels}"
    peers: list[Any] = []
    for rule in (r for p in policies for r in p.get("ingress", [])):
        if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
            continue
        peers += rule.get("from", [EVERYONE])
    return peers


# --- secrets ---------------------------------------------------------------------------------


def test_no_credential_value_is_written_anywhere_but_the_secret(
    manifests: list[Doc], credentials: StackCredentials,
) -> None:
    values = {credentials.admin, credentials.serve, credentials.ebpf,
              credentials.openai_api_key}
    for doc in manifests:
        if doc["kind"] != "Secret":
            text = yaml.safe_dump(doc)
            assert not [v for v in values if v in text], doc["kind"]
    assert set(_one(manifests, "Secret")["stringData"].values()) == values


def test_serve_config_names_the_files_the_ray_pods_mount_never_their_values(
    manifests: list[Doc],
) -> None:
    config = yaml.safe_load(_one(manifests, "RayService")["spec"]["serveConfigV2"])
    for application in config["applications"]:
        args = application["args"]
        assert "api_keys" not in args and "token" not in args["telemetry"]
        assert args["telemetry"]["token_file"] == f"{MOUNT}/serve.token"
    [ingress] = [a for a in config["applications"] if a["name"] == "aiops"]
    assert ingress["args"]["api_keys_file"] == f"{MOUNT}/openai-api.key"
    # ... and every Ray pod mounts exactly those two keys of the Secret there.
    for component in ("ray-head", "ray-worker"):
        pod = _pods(manifests)[component]["spec"]
        [volume] = pod["volumes"]
        assert volume["secret"]["secretName"] == "aiops-credentials"
        assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {
            "serve.token": "serve.token", "openai-api.key": "openai-api.key"}
        assert pod["containers"][0]["volumeMounts"] == [
            {"name": volume["name"], "mountPath": MOUNT, "readOnly": True}]


def test_every_secret_named_env_var_is_a_secret_reference(manifests: list[Doc]) -> None:
    env = [e for t in _pods(manifests).values()
           for c in [*t["spec"].get("initContainers", []), *t["spec"]["containers"]]
           for e in c.get("env", [])]
    secret_env = [e for e in env if SECRET_NAME.search(e["name"])]
    assert secret_env  # the server's agent key, at least
    for e in secret_env:
        assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == \
            "aiops-credentials", e["name"]


# --- network ---------------------------------------------------------------------------------


def test_ingress_is_denied_to_every_aiops_pod_unless_a_policy_allows_it(
    manifests: list[Doc],
) -> None:
    [deny] = [d for d in manifests if d["kind"] == "NetworkPolicy"
              and d["metadata"]["name"] == "aiops-default-deny"]
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    for component, template in _pods(manifests).items():
        assert _selects(deny["spec"]["podSelector"], template["metadata"]["labels"]), component
    # The eBPF collector takes no connection at all.
    assert _admitted(manifests, _pods(manifests)["ebpf"]["metadata"]["labels"], 4318) == []


def test_the_ray_head_admits_only_its_cluster_to_gcs_and_client_and_the_operator_to_the_dashboard(
    manifests: list[Doc],
) -> None:
    pods = _pods(manifests)
    head = pods["ray-head"]["metadata"]["labels"]
    [own_cluster] = _admitted(manifests, head, 6379)
    # The head and the workers of this RayService, nothing else (not the server).
    assert _selects(own_cluster["podSelector"], pods["ray-worker"]["metadata"]["labels"])
    assert _selects(own_cluster["podSelector"], head)
    assert not _selects(own_cluster["podSelector"], pods["server"]["metadata"]["labels"])
    other_cluster = {**pods["ray-worker"]["metadata"]["labels"],
                     "app.kubernetes.io/instance": "someone-elses"}
    assert not _selects(own_cluster["podSelector"], other_cluster)
    assert _admitted(manifests, head, 10001) == [own_cluster]
    # The dashboard binds 0.0.0.0 for the KubeRay operator, the one other client it admits.
    assert _cluster(manifests)["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert _admitted(manifests, head, 8265) == [own_cluster, {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "kuberay-operator"}}}]


def test_serve_stays_reachable_on_its_port_and_metrics_only_by_the_server(
    manifests: list[Doc],
) -> None:
    pods = _pods(manifests)
    server = {"podSelector": {"matchLabels": pods["server"]["metadata"]["labels"]}}
    for component in ("ray-head", "ray-worker"):
        labels = pods[component]["metadata"]["labels"]
        assert EVERYONE in _admitted(manifests, labels, 8000)  # the API key guards it
        assert server in _admitted(manifests, labels, 8080)
        assert EVERYONE not in _admitted(manifests, labels, 8080)


def test_the_server_takes_telemetry_from_ray_ebpf_and_grafana_only(manifests: list[Doc]) -> None:
    pods = _pods(manifests)
    peers = _admitted(manifests, pods["server"]["metadata"]["labels"], 4318)
    assert EVERYONE not in peers
    selected = [p["podSelector"] for p in peers]
    for component in ("ray-head", "ray-worker", "ebpf"):
        assert any(_selects(s, pods[component]["metadata"]["labels"]) for s in selected)
    assert {"namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "grafana"}}} in peers
    assert len(peers) == 3


def test_ray_token_authentication_is_on(manifests: list[Doc]) -> None:
    """KubeRay (1.5.1+) generates the token into its own Secret and gives it to every Ray
    container and to its own dashboard client: no token value in the manifests."""
    assert _cluster(manifests)["authOptions"] == {"mode": "token"}


# --- lint ------------------------------------------------------------------------------------


def test_the_shipped_render_passes_the_lint(manifests: list[Doc]) -> None:
    assert lint_documents(manifests) == []


def test_the_lint_fails_the_render_as_it_was(
    manifests: list[Doc], credentials: StackCredentials,
) -> None:
    """Tokens in serveConfigV2 and no NetworkPolicy: what `aiops k8s render` wrote before."""
    before = [copy.deepcopy(d) for d in manifests if d["kind"] != "NetworkPolicy"]
    rayservice = _one(before, "RayService")
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for application in config["applications"]:
        application["args"]["telemetry"]["token"] = credentials.serve
    config["applications"][0]["args"]["api_keys"] = [credentials.openai_api_key]
    rayservice["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    findings = lint_documents(before)
    assert {(f.rule, f.path.rsplit(".", 1)[-1]) for f in findings} == {
        ("secrets", "token"), ("secrets", "api_keys"), ("network", "labels")}
    assert len([f for f in findings if f.rule == "secrets"]) == 5
    heads = [f for f in findings if f.rule == "network" and "headGroupSpec" in f.path]
    assert heads and "6379" in heads[0].message
    assert not any(credentials.serve in str(f) for f in findings)  # findings never quote it


def _deployment(container: Doc, **metadata: Any) -> str:
    base = {"name": "web", "image": "registry.example/web:1.4.2",
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "256Mi"}}}
    return str(yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment",
                               "metadata": {"name": "web", **metadata},
                               "spec": {"template": {"spec": {"containers": [
                                   {**base, **container}]}}}}))


BEARER = "Bearer " + "q" * 40


@pytest.mark.parametrize(("manifest", "path"), [
    (_deployment({"env": [{"name": "AIOPS_TOKEN", "value": "s3cr3t-value"}]}),
     "spec.template.spec.containers[0].env[0].value"),
    (_deployment({"env": [{"name": "AIOPS_AGENT_LLM_API_KEY", "value": "sk-123"}]}),
     "spec.template.spec.containers[0].env[0].value"),
    (_deployment({"env": [{"name": "OTEL_EXPORTER_OTLP_HEADERS",
                           "value": "authorization=" + BEARER.replace(" ", "%20")}]}),
     "spec.template.spec.containers[0].env[0].value"),
    (_deployment({"args": ["serve", "--api-key=sk-123"]}),
     "spec.template.spec.containers[0].args[1]"),
    (_deployment({"command": ["collector", "--token", "s3cr3t-value"]}),
     "spec.template.spec.containers[0].command[2]"),
    (_deployment({}, annotations={"example.com/auth": BEARER}),
     "metadata.annotations.example.com/auth"),
    (yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"},
                     "data": {"serve.token": "s3cr3t-value"}}), "data.serve.token"),
    (yaml.safe_dump({"apiVersion": "ray.io/v1", "kind": "RayService",
                     "metadata": {"name": "web"}, "spec": {"serveConfigV2": yaml.safe_dump(
                         {"applications": [{"runtime_env": {"env_vars": {
                             "AIOPS_SLACK_SIGNING_SECRET": "s3cr3t-value"}}}]})}}),
     "spec.serveConfigV2:applications[0].runtime_env.env_vars.AIOPS_SLACK_SIGNING_SECRET"),
    (yaml.safe_dump({"apiVersion": "ray.io/v1", "kind": "RayService",
                     "metadata": {"name": "web"}, "spec": {"serveConfigV2": yaml.safe_dump(
                         {"applications": [{"args": {"headers": {
                             "Authorization": BEARER}}}]})}}),
     "spec.serveConfigV2:applications[0].args.headers.Authorization"),
], ids=["env-token", "env-api-key", "otlp-headers", "flag-equals", "flag-then-value",
        "annotation", "configmap", "serve-runtime-env", "serve-bearer"])
def test_the_lint_fails_a_secret_in_clear(manifest: str, path: str) -> None:
    findings = [f for f in lint(manifest) if f.rule == "secrets"]
    assert [f.path for f in findings] == [path]
    assert "s3cr3t-value" not in findings[0].message and "q" * 40 not in findings[0].message


def test_the_lint_lets_references_to_secrets_pass() -> None:
    manifest = _deployment({
        "env": [{"name": "AIOPS_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": "aiops-credentials", "key": "admin.token"}}},
                {"name": "AIOPS_TOKEN_FILE", "value": "/etc/aiops-credentials/admin.token"},
                {"name": "RAY_AUTH_MODE", "value": "token"},
                {"name": "AIOPS_TOKEN", "value": ""}],
        "args": ["--token-file", "/etc/aiops-credentials/serve.token", "--max-tokens=256"]})
    assert lint(manifest) == []
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "stringData": {"serve.token": "s3cr3t-value"}}
    assert lint(yaml.safe_dump(secret)) == []  # where secrets belong


def _rayservice(labels: dict[str, str] | None = None) -> Doc:
    container = yaml.safe_load(_deployment({}))["spec"]["template"]["spec"]["containers"][0]
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "rs", "namespace": "ml"},
            "spec": {"rayClusterConfig": {"headGroupSpec": {"template": {
                "metadata": {"labels": labels or {"app": "rs"}},
                "spec": {"containers": [container]}}}}}}


def _policy(selector: Doc, ingress: list[Doc] | None = None, namespace: str = "ml") -> Doc:
    spec: Doc = {"podSelector": selector, "policyTypes": ["Ingress"]}
    if ingress is not None:
        spec["ingress"] = ingress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "np", "namespace": namespace}, "spec": spec}


HEAD = "spec.rayClusterConfig.headGroupSpec.template.metadata.labels"


@pytest.mark.parametrize("policies", [
    [],
    [_policy({"matchLabels": {"app": "other"}})],
    [_policy({}, namespace="elsewhere")],
    [{**_policy({}), "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}],
], ids=["none", "other-pods", "other-namespace", "egress-only"])
def test_the_lint_fails_a_ray_head_no_network_policy_fences(policies: list[Doc]) -> None:
    findings = lint_documents([_rayservice(), *policies])
    assert [(f.resource, f.path, f.rule) for f in findings] == [
        ("RayService/rs", HEAD, "network")]
    assert "dashboard (8265)" in findings[0].message


@pytest.mark.parametrize("policy", [
    _policy({}),  # deny all
    _policy({"matchLabels": {"ray.io/node-type": "head"}},  # KubeRay's own label
            [{"from": [{"podSelector": {"matchLabels": {"app": "rs"}}}]}]),
    _policy({"matchLabels": {"app": "rs"}}, [{"ports": [{"port": 8000}]}]),
], ids=["deny-all", "own-pods-by-kuberay-label", "serve-port-only"])
def test_the_lint_passes_a_ray_head_a_policy_fences(policy: Doc) -> None:
    assert lint_documents([_rayservice(), policy]) == []


@pytest.mark.parametrize("rule", [
    {},
    {"ports": [{"port": 8265}]},
    {"from": [{"namespaceSelector": {}}], "ports": [{"port": "gcs"}]},
    {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 6000, "endPort": 7000}]},
], ids=["allow-all", "dashboard-from-anywhere", "gcs-from-any-namespace", "gcs-in-a-range"])
def test_the_lint_fails_a_policy_that_opens_ray_control_ports_to_everyone(rule: Doc) -> None:
    findings = lint_documents([_rayservice(), _policy({}, [rule])])
    [finding] = findings
    assert (finding.resource, finding.path, finding.rule) == (
        "NetworkPolicy/np", "spec.ingress[0]", "network")
    assert "Ray head of RayService/rs" in finding.message

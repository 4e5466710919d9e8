"""`aiops k8s lint`: each rule, on good and bad manifests, reports the path of what is wrong."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from aiops.k8s.cli import app
from aiops.k8s.lint import Finding, lint

GOOD_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    spec:
      containers:
      - name: web
        image: registry.example/web:1.4.2
        livenessProbe: {httpGet: {path: /healthz, port: 8080}}
        readinessProbe: {httpGet: {path: /readyz, port: 8080}}
        resources:
          requests: {cpu: 100m, memory: 128Mi}
          limits: {cpu: 500m, memory: 256Mi}
"""
C = "spec.template.spec.containers[0]"
Doc = dict[str, Any]
# Ingress denied to every pod of the namespace: fences Ray pods for the `network` rule.
DENY_ALL = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny-all"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}


def _mutated(change: Callable[[Doc, Doc, Doc], None]) -> str:
    """GOOD_DEPLOYMENT after ``change(doc, pod spec, container)``."""
    doc = yaml.safe_load(GOOD_DEPLOYMENT)
    pod = doc["spec"]["template"]["spec"]
    change(doc, pod, pod["containers"][0])
    return str(yaml.safe_dump(doc))


def test_a_complete_deployment_has_no_findings() -> None:
    assert lint(GOOD_DEPLOYMENT) == []


@pytest.mark.parametrize(("change", "path", "rule", "says"), [
    (lambda d, p, c: c.pop("livenessProbe"), f"{C}.livenessProbe", "probes",
     "has no livenessProbe"),
    (lambda d, p, c: c.pop("readinessProbe"), f"{C}.readinessProbe", "probes",
     "has no readinessProbe"),
    (lambda d, p, c: c["resources"].pop("limits"), f"{C}.resources.limits", "resources",
     "sets no cpu or memory limits"),
    (lambda d, p, c: c["resources"]["requests"].pop("memory"), f"{C}.resources.requests",
     "resources", "sets no memory requests"),
    (lambda d, p, c: c.update(image="registry.example/web:latest"), f"{C}.image", "image",
     "is not pinned (:latest)"),
    (lambda d, p, c: c.update(image="registry.example:5000/web"), f"{C}.image", "image",
     "has no tag"),
    (lambda d, p, c: c.update(securityContext={"privileged": True}),
     f"{C}.securityContext.privileged", "privilege", "is privileged"),
    (lambda d, p, c: c.update(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
     f"{C}.securityContext.capabilities.add", "privilege", "adds SYS_ADMIN"),
    (lambda d, p, c: p.update(hostPID=True), "spec.template.spec.hostPID", "privilege",
     "hostPID shares the node's namespace"),
    (lambda d, p, c: p.update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
     "spec.template.spec.volumes[0].hostPath", "privilege", "mounts a host path"),
])
def test_each_rule_reports_the_path_of_what_is_wrong(
    change: Callable[[Doc, Doc, Doc], None], path: str, rule: str, says: str,
) -> None:
    [finding] = lint(_mutated(change))
    assert (finding.resource, finding.path, finding.rule) == ("Deployment/web", path, rule)
    assert says in finding.message


def test_a_digest_pins_an_image_and_init_containers_need_no_probes() -> None:
    def change(d: Doc, p: Doc, c: Doc) -> None:
        c["image"] = "web@sha256:" + "a" * 64
        p["initContainers"] = [{"name": "init", "image": "busybox:1.36",
                                "resources": c["resources"]}]

    assert lint(_mutated(change)) == []


def test_privilege_is_allowed_only_where_named() -> None:
    def ebpf(d: Doc, p: Doc, c: Doc) -> None:
        d.update(kind="DaemonSet", metadata={"name": "aiops-ebpf"})
        p["hostPID"] = True
        c["securityContext"] = {"privileged": True}

    daemonset = _mutated(ebpf)
    assert lint(daemonset) == []
    assert {f.rule for f in lint(daemonset, privileged=())} == {"privilege"}


def test_ray_pods_are_checked_inside_a_rayservice() -> None:
    container = yaml.safe_load(GOOD_DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]
    worker = {k: v for k, v in container.items() if k != "readinessProbe"}
    rayservice = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "rs"},
                  "spec": {"rayClusterConfig": {
                      "headGroupSpec": {"template": {"spec": {"containers": [container]}}},
                      "workerGroupSpecs": [{"groupName": "cpu", "template": {
                          "spec": {"containers": [worker]}}}]}}}
    assert lint(yaml.safe_dump_all([rayservice, DENY_ALL])) == [Finding(
        "RayService/rs",
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].readinessProbe",
        "probes", "container 'web' has no readinessProbe")]


def test_a_rayservice_that_breaks_the_crd_schema_is_reported() -> None:
    bad = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "rs"},
           "spec": {"rayClusterConfig": {"workerGroupSpecs": [{"replicas": "two"}]}}}
    findings = lint(yaml.safe_dump(bad))
    assert {(f.path, f.rule) for f in findings} == {
        ("spec.rayClusterConfig.workerGroupSpecs[0]", "schema"),
        ("spec.rayClusterConfig.workerGroupSpecs[0].replicas", "schema")}


def test_lists_and_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        yaml.safe_load(_mutated(lambda d, p, c: c.update(image="web")))]}))
    result = CliRunner().invoke(app, ["lint", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}: Deployment/web: {C}.image: container 'web': image 'web' has no tag" \
        in result.output


def test_the_command_line_lints_its_files_as_one_set(tmp_path: Path) -> None:
    """A NetworkPolicy in one file fences the Ray pods of another (applied together)."""
    container = yaml.safe_load(GOOD_DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]
    rayservice = tmp_path / "rayservice.yaml"
    rayservice.write_text(yaml.safe_dump({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "rs"},
        "spec": {"rayClusterConfig": {
            "headGroupSpec": {"template": {"spec": {"containers": [container]}}}}}}))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(DENY_ALL))
    alone = CliRunner().invoke(app, ["lint", str(rayservice)])
    assert alone.exit_code == 1 and "[network]" in alone.output
    together = CliRunner().invoke(app, ["lint", str(rayservice), str(policy)])
    assert together.exit_code == 0, together.output

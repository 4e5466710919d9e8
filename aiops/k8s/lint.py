"""``aiops k8s lint``: what every workload must have, each finding with its path.

Rules, per container of every pod template (Deployment, StatefulSet, DaemonSet, Job, Pod,
and KubeRay's RayService / RayCluster head and worker groups):

- ``probes``: a liveness and a readiness probe (init containers excepted);
- ``resources``: cpu and memory requests and limits;
- ``image``: a pinned image, by tag or digest, never ``:latest`` or untagged;
- ``privilege``: no privileged container, privilege escalation, added capabilities, host
  PID/network/IPC or hostPath volume, except in the workloads allowed to (by default the eBPF
  collector's DaemonSet, which cannot load BPF programs otherwise);
- ``schema``: a RayService validates against KubeRay's CRD schema (``rayservice-v1-schema``);
- ``secrets``: no secret value in clear outside a Secret (env values, flags, annotations,
  ConfigMaps, a RayService's ``serveConfigV2``);
- ``network``: a NetworkPolicy fences every Ray pod, and none opens Ray's ports to everyone
  (both in ``aiops.k8s.lint_security``).

A path reads like ``spec.template.spec.containers[0].resources.limits``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from aiops.k8s.lint_security import network_issues, secret_issues

__all__ = ["DEFAULT_PRIVILEGED", "Finding", "lint", "lint_documents", "rayservice_schema"]

# "Kind/name" of the workloads that may run privileged.
DEFAULT_PRIVILEGED = frozenset({"DaemonSet/aiops-ebpf"})
SCHEMA_FILE = Path(__file__).with_name("rayservice-v1-schema.yaml")

_POD_TEMPLATE = {"Deployment": "spec.template", "StatefulSet": "spec.template",
                 "DaemonSet": "spec.template", "ReplicaSet": "spec.template",
                 "Job": "spec.template", "CronJob": "spec.jobTemplate.spec.template"}
_HOST_NAMESPACES = ("hostPID", "hostNetwork", "hostIPC")


@dataclass(frozen=True, order=True)
class Finding:
    resource: str  # Kind/name
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.resource}: {self.path}: {self.message} [{self.rule}]"


@functools.cache
def rayservice_schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load(SCHEMA_FILE.read_text())
    return schema


def lint(text: str, privileged: Iterable[str] = DEFAULT_PRIVILEGED,
         context: list[Any] | None = None) -> list[Finding]:
    """Findings for a YAML stream of manifests (``kind: List`` included)."""
    return lint_documents(list(yaml.safe_load_all(text)), privileged, context)


def lint_documents(docs: list[Any], privileged: Iterable[str] = DEFAULT_PRIVILEGED,
                   context: list[Any] | None = None) -> list[Finding]:
    """Findings for ``docs``; ``context`` adds documents applied with them (other files) that
    rules across objects consider (the NetworkPolicies) but that are not reported on."""
    allowed = frozenset(privileged)
    findings: list[Finding] = []
    docs = list(_flatten(docs))
    policies = [d for d in [*docs, *_flatten(context or [])] if d.get("kind") == "NetworkPolicy"]
    for doc in docs:
        resource = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        if doc.get("kind") == "RayService":
            findings += _schema_findings(resource, doc)
        for path, template in _pod_templates(doc):
            findings += _pod_findings(resource, path, template, resource in allowed)
        findings += [Finding(*issue) for issue in secret_issues(resource, doc)]
        findings += [Finding(*issue) for issue in network_issues(resource, doc, policies)]
    return sorted(set(findings))


def _flatten(docs: list[Any]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List":
            yield from _flatten(doc.get("items") or [])
        else:
            yield doc


def _get(doc: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _pod_templates(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = doc.get("kind", "")
    if kind == "Pod":
        yield "", doc
    elif kind in _POD_TEMPLATE:
        template = _get(doc, _POD_TEMPLATE[kind])
        if isinstance(template, dict):
            yield _POD_TEMPLATE[kind] + ".", template
    elif kind in ("RayService", "RayCluster"):
        cluster = "spec.rayClusterConfig" if kind == "RayService" else "spec"
        head = _get(doc, f"{cluster}.headGroupSpec.template")
        if isinstance(head, dict):
            yield f"{cluster}.headGroupSpec.template.", head
        for i, group in enumerate(_get(doc, f"{cluster}.workerGroupSpecs") or []):
            if isinstance(group, dict) and isinstance(group.get("template"), dict):
                yield f"{cluster}.workerGroupSpecs[{i}].template.", group["template"]


def _pod_findings(resource: str, prefix: str, template: dict[str, Any], may_privilege: bool
                  ) -> list[Finding]:
    spec = template.get("spec") or {}
    out: list[Finding] = []
    if not may_privilege:
        for key in _HOST_NAMESPACES:
            if spec.get(key):
                out.append(Finding(resource, f"{prefix}spec.{key}", "privilege",
                                   f"{key} shares the node's namespace"))
        for i, volume in enumerate(spec.get("volumes") or []):
            if isinstance(volume, dict) and "hostPath" in volume:
                out.append(Finding(resource, f"{prefix}spec.volumes[{i}].hostPath", "privilege",
                                   f"volume {volume.get('name')!r} mounts a host path"))
    for group, probes in (("containers", True), ("initContainers", False)):
        for i, c in enumerate(spec.get(group) or []):
            path = f"{prefix}spec.{group}[{i}]"
            out += _container_findings(resource, path, c, probes, may_privilege)
    if not spec.get("containers"):
        out.append(Finding(resource, f"{prefix}spec.containers", "schema",
                           "the pod template has no containers"))
    return out


def _container_findings(resource: str, path: str, c: dict[str, Any], probes: bool,
                        may_privilege: bool) -> list[Finding]:
    out = []
    name = c.get("name", "?")
    if probes:
        for probe in ("livenessProbe", "readinessProbe"):
            if not c.get(probe):
                out.append(Finding(resource, f"{path}.{probe}", "probes",
                                   f"container {name!r} has no {probe}"))
    resources = c.get("resources") or {}
    for kind in ("requests", "limits"):
        missing = [r for r in ("cpu", "memory") if r not in (resources.get(kind) or {})]
        if missing:
            out.append(Finding(resource, f"{path}.resources.{kind}", "resources",
                               f"container {name!r} sets no {' or '.join(missing)} {kind}"))
    problem = _image_problem(c.get("image"))
    if problem:
        out.append(Finding(resource, f"{path}.image", "image", f"container {name!r}: {problem}"))
    if not may_privilege:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(Finding(resource, f"{path}.securityContext.privileged", "privilege",
                               f"container {name!r} is privileged"))
        if sc.get("allowPrivilegeEscalation"):
            out.append(Finding(resource, f"{path}.securityContext.allowPrivilegeEscalation",
                               "privilege", f"container {name!r} allows privilege escalation"))
        added = (sc.get("capabilities") or {}).get("add") or []
        if added:
            out.append(Finding(resource, f"{path}.securityContext.capabilities.add",
                               "privilege", f"container {name!r} adds {', '.join(added)}"))
    return out


def _image_problem(image: Any) -> str | None:
    if not isinstance(image, str) or not image:
        return "no image"
    if "@sha256:" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"image {image!r} has no tag (it means :latest)"
    if last.rsplit(":", 1)[1] == "latest":
        return f"image {image!r} is not pinned (:latest)"
    return None


def _schema_findings(resource: str, doc: dict[str, Any]) -> list[Finding]:
    validator = jsonschema.Draft202012Validator(rayservice_schema())
    return [Finding(resource, _json_path(e.absolute_path) or "(document)", "schema", e.message)
            for e in validator.iter_errors(doc)]


def _json_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out

"""Kubernetes manifests for aiops: a KubeRay ``RayService`` built from the model specs, the aiops
server (Deployment, Service, PersistentVolumeClaim, the spec file as a ConfigMap), the eBPF
collector (a privileged DaemonSet, the one privileged workload) and the NetworkPolicies that
fence them (``aiops.k8s.network``).

The Serve configuration inside the RayService is ``serve.app.deploy_config``, the very document
``aiops up`` deploys, so a model spec means the same thing on a laptop and in a cluster. What
differs: KubeRay deploys it (no Serve driver), so the lifecycle control plane, validation gates
and the ``aiops.serve.replicas`` gauges of ``serve.runner`` are absent, and a version change is
an edit of the spec file, ``aiops k8s render`` and ``kubectl apply``.

Nothing is unauthenticated and no secret is hard-coded or written outside a Secret: the Secret
``aiops-credentials`` carries the admin token, the Serve and eBPF ingest tokens and the OpenAI
endpoints' API key, taken from a credentials directory that ``aiops credentials init`` fills on
the first render and that later renders reuse (``StackCredentials.load``); rendered without
credentials, the Secret is left out and must exist. Every pod gets only its own keys, mounted
as files or referenced (``secretKeyRef``): the server's init container adopts them all into its
data volume (``aiops credentials init --from``, which registers the tokens); the eBPF collector
mounts its ingest token where it reads it (``<data_dir>/credentials/``); the Ray pods mount the
``serve`` token and the API key, and ``serveConfigV2`` names those files, read by the builders
of ``aiops.k8s.serve_apps`` (the RayService holds no secret). Ray's own token authentication
(``authOptions``, KubeRay 1.5.1+) guards the GCS, dashboard and client ports with a token the
operator generates and keeps in a Secret of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from aiops.k8s.network import component_labels, network_policies, ray_pod_labels
from serve.specs import ModelSpec

__all__ = ["RenderOptions", "StackCredentials", "render", "render_yaml", "to_yaml"]

SERVER = "aiops-server"
RAYSERVICE = "aiops"
MODELS_MOUNT = "/etc/aiops"
SECRET = "aiops-credentials"
SECRET_MOUNT = "/etc/aiops-credentials"
DATA_DIR = "/data"
# The image's unprivileged user (deploy/Dockerfile): fsGroup makes the volumes its own.
AIOPS_UID = 10001
# Ports: the aiops server (OTLP's standard), Serve's proxy, Ray's metrics export (KubeRay's
# default, exposed by the head service KubeRay creates as <name>-head-svc).
SERVER_PORT, SERVE_PORT, RAY_METRICS_PORT = 4318, 8000, 8080
RAY_DASHBOARD_PORT = 8265
# What the Ray pods mount from the Secret: the replicas' ingest token and the API key.
RAY_CREDENTIALS = ("serve.token", "openai-api.key")
# Ray's health endpoints (dashboard agent on every node, GCS through the head's dashboard):
# the checks KubeRay itself injects, written with Python because the image has no wget.
_RAYLET = "http://localhost:52365/api/local_raylet_healthz"
_GCS = "http://localhost:8265/api/gcs_healthz"
_SERVE = f"http://localhost:{SERVE_PORT}/-/healthz"


@dataclass(frozen=True)
class RenderOptions:
    image: str = "aiops:0.1.0"
    namespace: str = "aiops"
    ray_version: str = "2.60.0"
    worker_cpus: int = 4
    worker_memory: str = "8Gi"
    head_cpus: int = 2
    head_memory: str = "4Gi"
    server_cpus: int = 2
    server_memory: str = "4Gi"
    data_size: str = "20Gi"
    ebpf: bool = True
    # Ray's token authentication through KubeRay's authOptions (KubeRay 1.5.1 or newer).
    ray_auth: bool = True
    # Namespace of the KubeRay operator, the one client of the Ray dashboard; None: any.
    operator_namespace: str | None = None
    # CIDRs allowed to reach Serve's port besides the server; empty: every source.
    serve_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackCredentials:
    """The secrets a cluster deployment needs, as ``aiops credentials init`` made them."""

    admin: str
    serve: str
    ebpf: str
    openai_api_key: str

    # Secret key -> attribute; the keys are the files' names in a data directory, so the
    # server's init container adopts a mounted Secret as it is.
    KEYS: ClassVar[dict[str, str]] = {"admin.token": "admin", "serve.token": "serve",
                                      "ebpf.token": "ebpf", "openai-api.key": "openai_api_key"}

    @classmethod
    def load(cls, directory: Path) -> StackCredentials:
        """Generate-or-read the credentials in ``directory`` (a data directory of its own:
        the first render generates, later renders reuse, so a re-apply rotates nothing)."""
        from aiops.credentials import BY_NAME, init

        init(directory)
        values = {}
        for key, attr in cls.KEYS.items():
            name = key.rsplit(".", 1)[0]
            values[attr] = (directory / BY_NAME[name].file).read_text().strip()
        return cls(**values)

    def secret_data(self) -> dict[str, str]:
        return {key: getattr(self, attr) for key, attr in self.KEYS.items()}


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no types
    """Readable manifests: no anchors for repeated label maps, multi-line strings (the
    Serve config, the spec file) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _url_check(*urls: str) -> dict[str, Any]:
    code = ("import urllib.request as u; "
            f"[u.urlopen(x, timeout=2).read() for x in {list(urls)!r}]")
    return {"exec": {"command": ["python", "-c", code]}}


def _probe(check: dict[str, Any], period: int = 10, delay: int = 10,
           failures: int = 3) -> dict[str, Any]:
    return {**check, "initialDelaySeconds": delay, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _resources(cpus: int | str, memory: str) -> dict[str, Any]:
    # Requests equal to limits: the Guaranteed class, and Ray's view of its node is true.
    r = {"cpu": str(cpus), "memory": memory}
    return {"requests": dict(r), "limits": dict(r)}


def _meta(name: str, o: RenderOptions, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": o.namespace, "labels": component_labels(component)}


def _env(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def _secret_env(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}


def _credential_volume(keys: list[str]) -> dict[str, Any]:
    """The Secret, with only ``keys``, readable by the aiops user's group (fsGroup)."""
    return {"name": "credentials", "secret": {
        "secretName": SECRET, "defaultMode": 0o440,
        "items": [{"key": k, "path": k} for k in keys]}}


def _ingest_credential(source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) putting one ingest token where its client reads it:
    ``<data_dir>/credentials/<source>.token``."""
    key = f"{source}.token"
    return (_credential_volume([key]),
            {"name": "credentials", "mountPath": f"{DATA_DIR}/credentials", "readOnly": True})


def secret(credentials: StackCredentials, o: RenderOptions) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(SECRET, o, "server"),
            "type": "Opaque", "stringData": credentials.secret_data()}


def serve_config(specs: list[ModelSpec], o: RenderOptions) -> dict[str, Any]:
    """The Serve deploy document for the cluster: ``deploy_config`` with telemetry sent to
    the aiops server's Service, the proxy listening on every node and, by reference to the
    files the Ray pods mount (``aiops.k8s.serve_apps``), the exporters' ``serve`` ingest token
    and the OpenAI endpoints' API key."""
    from aiops.k8s.serve_apps import by_reference
    from serve.app import deploy_config
    from serve.telemetry import TelemetryConfig

    telemetry = TelemetryConfig(f"http://{SERVER}.{o.namespace}.svc:{SERVER_PORT}")
    config = deploy_config(specs, telemetry, {"max_request_bytes": 20 * 2**20})
    return {"proxy_location": "EveryNode",
            "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
            **by_reference(config, f"{SECRET_MOUNT}/serve.token",
                           f"{SECRET_MOUNT}/openai-api.key")}


def _worker_replicas(specs: list[ModelSpec], o: RenderOptions) -> tuple[int, int]:
    """Workers for every version's min and max replicas (plus the ingress), by CPU."""
    ingress = 0.1
    low = ingress + sum(s.resources.num_cpus * s.autoscaling.min_replicas for s in specs)
    high = ingress + sum(s.resources.num_cpus * s.autoscaling.max_replicas for s in specs)
    return max(1, math.ceil(low / o.worker_cpus)), max(1, math.ceil(high / o.worker_cpus))


def _ray_pod(component: str, container: dict[str, Any]) -> dict[str, Any]:
    """A Ray pod template: its labels (the NetworkPolicies select on them) and the Secret's
    ``RAY_CREDENTIALS`` as files, readable by the image's user through fsGroup."""
    mount = {"name": "credentials", "mountPath": SECRET_MOUNT, "readOnly": True}
    return {"metadata": {"labels": ray_pod_labels(RAYSERVICE, component)},
            "spec": {"securityContext": {"fsGroup": AIOPS_UID},
                     "containers": [{**container, "volumeMounts": [mount]}],
                     "volumes": [_credential_volume(list(RAY_CREDENTIALS))]}}


def rayservice(specs: list[ModelSpec], o: RenderOptions) -> dict[str, Any]:
    low, high = _worker_replicas(specs, o)
    ports = [{"containerPort": p, "name": n} for n, p in (
        ("gcs", 6379), ("dashboard", RAY_DASHBOARD_PORT), ("client", 10001),
        ("serve", SERVE_PORT), ("metrics", RAY_METRICS_PORT))]
    head = {
        "name": "ray-head", "image": o.image, "ports": ports,
        "resources": _resources(o.head_cpus, o.head_memory),
        "livenessProbe": _probe(_url_check(_RAYLET, _GCS), delay=30, failures=120),
        "readinessProbe": _probe(_url_check(_RAYLET, _GCS), delay=10, period=5, failures=10),
    }
    worker = {
        "name": "ray-worker", "image": o.image,
        "ports": [{"containerPort": SERVE_PORT, "name": "serve"}],
        "resources": _resources(o.worker_cpus, o.worker_memory),
        "livenessProbe": _probe(_url_check(_RAYLET), delay=30, failures=120),
        "readinessProbe": _probe(_url_check(_RAYLET, _SERVE), delay=10, period=5,
                                 failures=10),
    }
    cluster: dict[str, Any] = {
        "rayVersion": o.ray_version,
        "enableInTreeAutoscaling": True,
        "headGroupSpec": {
            # No replicas on the head: it keeps the GCS, the controller and a proxy. The
            # dashboard binds every interface because the KubeRay operator deploys
            # serveConfigV2 and reads Serve's status through it, by the head Service; the
            # aiops-ray-dashboard NetworkPolicy admits only the operator (and aiops-ray the
            # cluster's own pods), and Ray's token authentication guards it.
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0",
                               "metrics-export-port": str(RAY_METRICS_PORT)},
            "template": _ray_pod("ray-head", head),
        },
        "workerGroupSpecs": [{
            "groupName": "cpu", "replicas": low, "minReplicas": low,
            "maxReplicas": high,
            "rayStartParams": {"num-cpus": str(o.worker_cpus),
                               "metrics-export-port": str(RAY_METRICS_PORT)},
            "template": _ray_pod("ray-worker", worker),
        }],
    }
    if o.ray_auth:
        # KubeRay generates the token into a Secret of its own, sets RAY_AUTH_MODE and
        # RAY_AUTH_TOKEN (from that Secret) on every Ray container and sends the token to
        # the dashboard itself. Ray's health endpoints, which the probes call, stay open.
        cluster["authOptions"] = {"mode": "token"}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": _meta(RAYSERVICE, o, "serving"),
        "spec": {
            "serveConfigV2": yaml.dump(serve_config(specs, o), Dumper=_Dumper,
                                       sort_keys=False),
            "rayClusterConfig": cluster,
        },
    }


def server_manifests(specs_text: str, o: RenderOptions) -> list[dict[str, Any]]:
    labels = _meta(SERVER, o, "server")["labels"]
    data_mount = {"name": "data", "mountPath": DATA_DIR}
    # Adopts the Secret's credentials into the data volume and registers the tokens, before
    # the server starts (which, bound beyond loopback, wants a token on every request).
    init = {
        "name": "credentials", "image": o.image,
        "command": ["aiops", "credentials", "init", "--from", SECRET_MOUNT],
        "env": _env({"AIOPS_DATA_DIR": DATA_DIR}),
        "resources": _resources("250m", "512Mi"),
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": [data_mount, {"name": "credentials", "mountPath": SECRET_MOUNT,
                                      "readOnly": True}],
    }
    container = {
        "name": "server", "image": o.image, "command": ["aiops", "server"],
        "ports": [{"containerPort": SERVER_PORT, "name": "http"}],
        "env": [*_env({
            "AIOPS_SERVER_HOST": "0.0.0.0", "AIOPS_DATA_DIR": DATA_DIR,
            "AIOPS_MODELS_FILE": f"{MODELS_MOUNT}/models.yaml",
            "AIOPS_SCRAPE_TARGETS": f"ray=http://{RAYSERVICE}-head-svc.{o.namespace}.svc:"
                                    f"{RAY_METRICS_PORT}/metrics",
            # The agent's LLM: the cluster's OpenAI endpoint (KubeRay's serve service).
            "AIOPS_AGENT_LLM_URL": f"http://{RAYSERVICE}-serve-svc.{o.namespace}.svc:"
                                   f"{SERVE_PORT}/v1"}),
            _secret_env("AIOPS_AGENT_LLM_API_KEY", "openai-api.key")],
        "resources": _resources(o.server_cpus, o.server_memory),
        "livenessProbe": _probe({"httpGet": {"path": "/healthz", "port": SERVER_PORT}}),
        "readinessProbe": _probe({"httpGet": {"path": "/readyz", "port": SERVER_PORT}},
                                 delay=5, period=5),
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": [data_mount,
                         {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("aiops-models", o, "server"),
         "data": {"models.yaml": specs_text}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": _meta("aiops-data", o, "server"),
         "spec": {"accessModes": ["ReadWriteOnce"],
                  "resources": {"requests": {"storage": o.data_size}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(SERVER, o, "server"),
         "spec": {
             # One replica and Recreate: the server is the DuckDB file's single writer.
             "replicas": 1, "strategy": {"type": "Recreate"},
             "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "securityContext": {"fsGroup": AIOPS_UID},
                 "initContainers": [init],
                 "containers": [container],
                 "volumes": [{"name": "data",
                              "persistentVolumeClaim": {"claimName": "aiops-data"}},
                             {"name": "models", "configMap": {"name": "aiops-models"}},
                             _credential_volume(list(StackCredentials.KEYS))]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(SERVER, o, "server"),
         "spec": {"selector": labels,
                  "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": SERVER_PORT}]}},
    ]


def ebpf_daemonset(o: RenderOptions) -> dict[str, Any]:
    labels = _meta("aiops-ebpf", o, "ebpf")["labels"]
    # Its OTLP exports carry the `ebpf` ingest token, read from the data directory.
    volume, mount = _ingest_credential("ebpf")
    ready = {"exec": {"command": ["test", "-f", "/data/ebpf.ready"]}}
    host_paths = {"debugfs": "/sys/kernel/debug", "bpffs": "/sys/fs/bpf",
                  "modules": "/lib/modules", "headers": "/usr/src"}
    container = {
        "name": "ebpf", "image": o.image, "command": ["python", "-m", "collectors.ebpf"],
        "env": _env({"AIOPS_SERVER_HOST": f"{SERVER}.{o.namespace}.svc",
                     "AIOPS_SERVER_PORT": str(SERVER_PORT), "AIOPS_DATA_DIR": "/data"}),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"cpu": "500m", "memory": "512Mi"}},
        "livenessProbe": _probe(ready, delay=30, period=30),
        "readinessProbe": _probe(ready, delay=5, period=10),
        # Loading BPF programs and reading tracefs needs it; this is the only privileged pod.
        "securityContext": {"privileged": True},
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, mount,
                         *({"name": n, "mountPath": p, "readOnly": n in ("modules", "headers")}
                           for n, p in host_paths.items())],
    }
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta("aiops-ebpf", o, "ebpf"),
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            # Host PIDs: the probes see every process; attribution reads their /proc entries.
            "spec": {"hostPID": True, "containers": [container],
                     "securityContext": {"fsGroup": AIOPS_UID},
                     "volumes": [{"name": "data", "emptyDir": {}}, volume,
                                 *({"name": n, "hostPath": {"path": p}}
                                   for n, p in host_paths.items())]}}},
    }


def policies(o: RenderOptions) -> list[dict[str, Any]]:
    return network_policies(
        o.namespace, RAYSERVICE, server=component_labels("server"), server_port=SERVER_PORT,
        serve_port=SERVE_PORT, metrics_port=RAY_METRICS_PORT,
        dashboard_port=RAY_DASHBOARD_PORT,
        ebpf=component_labels("ebpf") if o.ebpf else None,
        operator_namespace=o.operator_namespace, serve_from=o.serve_from)


def render(specs: list[ModelSpec], specs_text: str, o: RenderOptions | None = None, *,
           credentials: StackCredentials | None) -> list[dict[str, Any]]:
    """Every manifest, in the order ``kubectl apply`` should see them: the NetworkPolicies
    before the pods they fence. ``credentials`` None leaves the Secret out (it must exist,
    made from a credentials directory: docs/deploy.md)."""
    o = o or RenderOptions()
    docs = [*([secret(credentials, o)] if credentials is not None else []), *policies(o),
            *server_manifests(specs_text, o), rayservice(specs, o)]
    if o.ebpf:
        docs.append(ebpf_daemonset(o))
    return docs


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return str(yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False))


def render_yaml(specs_file: Path, credentials_dir: Path | None,
                o: RenderOptions | None = None) -> str:
    """YAML of ``render``; ``credentials_dir`` None: without the Secret."""
    from serve.specs import load_specs

    credentials = (StackCredentials.load(credentials_dir) if credentials_dir is not None
                   else None)
    return to_yaml(render(load_specs(specs_file), specs_file.read_text(), o,
                          credentials=credentials))

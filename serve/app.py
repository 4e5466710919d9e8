"""The Serve applications, deployed declaratively so that changes touch only what changed.

One application per model version (``<name>-<version>``, not exposed over HTTP) and one
ingress application (``aiops``, route ``/``). This is the one place where Ray's deployment
decorator meets the plain classes (``ModelReplica``, ``Ingress``).

Why separate applications: Serve restarts every replica of an application whose build
arguments change (and an imperative ``serve.run`` restarts everything, always). With one
application per version, adding or changing a version restarts only that version. What must
change without any restart travels in ``user_config`` and reaches ``reconfigure`` in place:
the ingress's routing table (versions, weights, stickiness) and each version's faults.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve

from serve.gates import Trust
from serve.ingress import INGRESS_NAME, Ingress
from serve.replica import ModelReplica
from serve.responses import replica_resource
from serve.specs import ModelSpec
from serve.telemetry import TelemetryConfig

__all__ = [
    "APP_NAME",
    "STICKY_HEADER",
    "ModelDeployment",
    "deploy_config",
    "deployment_options",
    "ingress_app",
    "model_app",
    "routing_table",
]

APP_NAME = "aiops"
STICKY_HEADER = "x-aiops-session"
# Spec fields that change in place (user_config) rather than by redeploying the version.
# (Autoscaling bounds as a config-file override of the deployment did not take effect on
# Ray 2.60 here: the chat model stopped scaling out. They stay in the build arguments, so a
# `scale` redeploys that version's replicas.)
_LIVE_FIELDS = {"traffic", "faults", "shed"}


class ModelDeployment(ModelReplica):
    """A ModelReplica that knows which Serve replica it is and closes with it."""

    def __init__(self, spec: dict[str, Any], telemetry: dict[str, Any],
                 trust: dict[str, Any] | None = None) -> None:
        s = ModelSpec.model_validate(spec)
        t = Trust(bool((trust or {}).get("strict")),
                  tuple(Path(k) for k in (trust or {}).get("keys", ())))
        super().__init__(s, TelemetryConfig(**telemetry), replica_resource(s.name, s.version),
                         trust=t)

    def __del__(self) -> None:
        # Serve calls __del__ when it stops a replica: flush telemetry, free the model.
        if hasattr(self, "backend"):
            self.close()


def deployment_options(spec: ModelSpec) -> Mapping[str, Any]:
    actor: dict[str, Any] = {"num_cpus": spec.resources.num_cpus}
    if spec.resources.num_gpus:
        actor["num_gpus"] = spec.resources.num_gpus
    if spec.resources.memory_mb:
        actor["memory"] = spec.resources.memory_mb * 2**20
    if spec.python is not None:
        actor["runtime_env"] = {"py_executable": str(spec.python)}
    return {
        "name": spec.deployment_name,
        "max_ongoing_requests": spec.max_ongoing_requests,
        "autoscaling_config": spec.autoscaling.serve_config(),
        "ray_actor_options": actor,
        "graceful_shutdown_timeout_s": 10,
    }


def model_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for one model version (import path ``serve.app:model_app``)."""
    spec = ModelSpec.model_validate(args["spec"])
    deployment: Any = serve.deployment(ModelDeployment)
    app: serve.Application = deployment.options(**deployment_options(spec)).bind(
        args["spec"], args["telemetry"], args.get("trust"))
    return app


def ingress_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for the ingress (import path ``serve.app:ingress_app``)."""
    deployment: Any = serve.deployment(Ingress)
    app: serve.Application = deployment.options(
        name=INGRESS_NAME, max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.1},
    ).bind(args)
    return app


def routing_table(specs: list[ModelSpec], unrouted: frozenset[str] = frozenset()
                  ) -> dict[str, Any]:
    """The ingress's user_config: per model, its versions with weights and specs. Versions in
    ``unrouted`` (deployment names: staged, not yet through their gates) are left out."""
    models: dict[str, list[dict[str, Any]]] = {}
    for s in specs:
        if s.deployment_name in unrouted:
            continue
        models.setdefault(s.name, []).append({
            "version": s.version, "app": s.deployment_name, "deployment": s.deployment_name,
            "weight": 100 if s.traffic is None else s.traffic,
            "shed": [p.value for p in s.shed],
            "digest": s.artifact.digest() if s.artifact is not None else "none",
            "spec": s.model_dump(mode="json", exclude=_LIVE_FIELDS),
        })
    return {"sticky_header": STICKY_HEADER, "models": models}


def deploy_config(specs: list[ModelSpec], telemetry: TelemetryConfig,
                  ingress_args: dict[str, Any], unrouted: frozenset[str] = frozenset(),
                  trust: Trust | None = None) -> dict[str, Any]:
    """A ServeDeploySchema document for the whole stack."""
    trust = trust or Trust()
    trust_args = {"strict": trust.strict, "keys": [str(k) for k in trust.keys]}
    tele = {"endpoint": telemetry.endpoint, "export_interval_s": telemetry.export_interval_s,
            "provenance": telemetry.provenance, "certificate_file": telemetry.certificate_file,
            # The stack's ingest credential travels in the Serve config (readable by whoever
            # holds Ray's own token, who can redeploy anything anyway).
            "token": telemetry.token}
    apps: list[dict[str, Any]] = [{
        "name": APP_NAME, "route_prefix": "/", "import_path": "serve.app:ingress_app",
        "args": {**ingress_args, "telemetry": tele},
        "deployments": [{"name": INGRESS_NAME,
                         "user_config": routing_table(specs, unrouted)}],
    }]
    for s in specs:
        apps.append({
            "name": s.deployment_name, "route_prefix": None,
            "import_path": "serve.app:model_app",
            "args": {"spec": s.model_dump(mode="json", exclude=_LIVE_FIELDS), "telemetry": tele,
                     "trust": trust_args},
            "deployments": [{"name": s.deployment_name,
                             "user_config": {"faults": s.faults.model_dump()}}],
        })
    return {"applications": apps}

"""The Ray Serve application: the ingress plus one deployment per model version.

This is the one place where Ray's deployment decorator meets the plain classes
(``ModelReplica``, ``Ingress``): each spec's resources, concurrency and autoscaling become
Serve deployment options here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve

from serve.ingress import INGRESS_NAME, Ingress, _replica_resource
from serve.options import ServeOptions
from serve.replica import ModelReplica
from serve.specs import ModelSpec
from serve.telemetry import TelemetryConfig

__all__ = ["APP_NAME", "ModelDeployment", "build_app", "deployment_options"]

APP_NAME = "aiops"


class ModelDeployment(ModelReplica):
    """A ModelReplica that knows which Serve replica it is and closes with it."""

    def __init__(self, spec: ModelSpec, telemetry: TelemetryConfig) -> None:
        super().__init__(spec, telemetry, _replica_resource(spec.name, spec.version))

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
        "graceful_shutdown_timeout_s": 5,
    }


def build_app(options: ServeOptions) -> serve.Application:
    model_deployment: Any = serve.deployment(ModelDeployment)
    handles = {
        spec.name: model_deployment.options(**deployment_options(spec)).bind(
            spec, options.telemetry)
        for spec in options.specs
    }
    ingress_deployment: Any = serve.deployment(Ingress)
    ingress = ingress_deployment.options(
        name=INGRESS_NAME, max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.1})
    return ingress.bind(handles, options)  # type: ignore[no-any-return]

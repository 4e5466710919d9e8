"""What aiops observes and acts on in a Ray Serve cluster, defined once.

A Serve *application* (one entry of the Serve config, deployed with ``serve deploy``) holds
*deployments*, each run by *replicas*. aiops names each deployment a *service* (what incidents,
panels and chat-ops name) and each deployed config of its application a *version* (what a
rollback returns to). Both are read from Ray Serve itself: the application's deployed config
and deployment graph, as the Serve REST API (``GET /api/serve/applications/``) and the Serve
controller inside a replica report them, so the server reading the REST API and the tracing
exporter inside a replica (``aiops.attach.serve_tracing``) compute the same names from the same
rules here.

Service of a deployment, first that applies:
  1. its own ``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) in the
     deployment's ``ray_actor_options.runtime_env.env_vars``;
  2. the application's, in the app's ``runtime_env.env_vars`` (every replica of the app has it);
  3. the application's name for its ingress deployment (what clients call), and
     ``<app>.<deployment>`` for the others.

Version of a deployment, first that applies: its own ``OTEL_SERVICE_VERSION`` (or
``service.version``), the application's, else ``cfg-`` and 8 hex digits of the SHA-256 of the
application's config without its scaling fields: a release is a change of code or settings,
while a scale (``num_replicas``, autoscaling bounds) keeps the version it scaled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["APP", "DEPLOYMENT", "INGRESS_SERVICE", "PROXY_SERVICE", "REPLICA", "SCALING_FIELDS",
           "SERVICE_VERSION", "ServeIdentity", "app_version", "deployment_service",
           "deployment_version", "env_vars", "identities", "ingress_of", "resource_attr"]

# Span and resource attributes naming the Serve entity a span came from (no OpenTelemetry
# semantic convention covers Ray Serve; these follow its ``ray.*`` naming).
APP = "ray.serve.app"
DEPLOYMENT = "ray.serve.deployment"
REPLICA = "ray.serve.replica"
# OpenTelemetry's resource attribute for the release a process runs (what a version is read
# from, by the rules above, and what aiops' exporters set).
SERVICE_VERSION = "service.version"

# The service of Serve's HTTP proxies' spans: every application's clients, as they saw it. It
# calls every application (a front, as the embedded stack's ingress is), never a cause alone.
PROXY_SERVICE = "ray-serve-proxy"
# The service of aiops' own OpenAI-compatible front door (``serve.ingress``): its server spans
# are what its users saw; it routes to every model, so it is never a model or a cause alone.
INGRESS_SERVICE = "ingress"

# Per-deployment fields that scale a release rather than change it.
SCALING_FIELDS = frozenset({"num_replicas", "autoscaling_config"})


@dataclass(frozen=True)
class ServeIdentity:
    """One deployment of one application, as aiops names it."""

    app: str
    deployment: str
    service: str
    version: str


def env_vars(holder: Mapping[str, Any] | None) -> dict[str, str]:
    """``runtime_env.env_vars`` of an app config or of a deployment's ``ray_actor_options``."""
    env = ((holder or {}).get("runtime_env") or {}).get("env_vars") or {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {}


def resource_attr(env: Mapping[str, str], key: str) -> str | None:
    """``key`` from ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k=v``), as the OTel SDK reads it."""
    for part in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip() == key and v.strip():
            return v.strip()
    return None


def _explicit_service(env: Mapping[str, str]) -> str | None:
    return env.get("OTEL_SERVICE_NAME") or resource_attr(env, "service.name")


def _explicit_version(env: Mapping[str, str]) -> str | None:
    return env.get("OTEL_SERVICE_VERSION") or resource_attr(env, SERVICE_VERSION)


def _deployment_config(config: Mapping[str, Any], deployment: str) -> Mapping[str, Any]:
    for d in config.get("deployments") or []:
        if isinstance(d, Mapping) and d.get("name") == deployment:
            return d
    return {}


def app_version(config: Mapping[str, Any]) -> str:
    """The release an application config is: its own ``service.version``, else its hash."""
    explicit = _explicit_version(env_vars(config))
    if explicit:
        return explicit
    release = dict(config)
    # Without their scaling fields, in name order; an entry left naming only its deployment
    # says nothing (a scale may add one for a deployment the config did not list).
    deployments = [{k: v for k, v in d.items() if k not in SCALING_FIELDS}
                   for d in config.get("deployments") or [] if isinstance(d, Mapping)]
    release["deployments"] = sorted((d for d in deployments if set(d) - {"name"}),
                                    key=lambda d: str(d.get("name", "")))
    if not release["deployments"]:
        del release["deployments"]
    return "cfg-" + hashlib.sha256(orjson.dumps(release, option=orjson.OPT_SORT_KEYS)
                                   ).hexdigest()[:8]


def deployment_version(config: Mapping[str, Any], deployment: str) -> str:
    own = _deployment_config(config, deployment).get("ray_actor_options")
    return _explicit_version(env_vars(own if isinstance(own, Mapping) else None)) \
        or app_version(config)


def deployment_service(app: str, deployment: str, config: Mapping[str, Any] | None,
                       ingress: bool) -> str:
    own = _deployment_config(config or {}, deployment).get("ray_actor_options")
    return (_explicit_service(env_vars(own if isinstance(own, Mapping) else None))
            or _explicit_service(env_vars(config)) or (app if ingress else f"{app}.{deployment}"))


def ingress_of(app: Mapping[str, Any]) -> str | None:
    """The ingress deployment of an application in Serve's answer (its deployment graph
    marks it; an app of one deployment has no other)."""
    nodes = (app.get("deployment_topology") or {}).get("nodes")
    if isinstance(nodes, Mapping):
        for name, node in nodes.items():
            if isinstance(node, Mapping) and node.get("is_ingress"):
                return str(name)
    deps = list(app.get("deployments") or {})
    return str(deps[0]) if len(deps) == 1 else None


def identities(app_name: str, app: Mapping[str, Any]) -> dict[str, ServeIdentity]:
    """Each deployment of one application in Serve's answer (``applications[app_name]`` of
    ``GET /api/serve/applications/`` or of the controller's instance details), by name.
    An application deployed imperatively (``serve.run``) has no config: version
    ``imperative``."""
    config = app.get("deployed_app_config")
    config = config if isinstance(config, Mapping) else None
    ingress = ingress_of(app)
    names = list(app.get("deployments") or {}) or [
        str(d["name"]) for d in (config or {}).get("deployments") or []
        if isinstance(d, Mapping) and d.get("name")]
    return {d: ServeIdentity(app_name, d, deployment_service(app_name, d, config, d == ingress),
                             deployment_version(config, d) if config else "imperative")
            for d in names}

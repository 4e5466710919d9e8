"""Remediation through the owner's control plane: the ``ControlPlane`` of an attached Ray
cluster (its Serve REST API), of a vLLM server (which can do nothing), and ``Planes``, which
puts the embedded stack and every attached target behind one ``ControlPlane``.

On a Ray cluster a rollback re-applies the application's last healthy config (kept by
``ConfigHistory``) and a scale rewrites ``num_replicas`` or the autoscaling bounds in the
current config; Serve has one config per application, so there are no traffic weights to
shift, no canary to promote and no replica to restart from outside. Each of those, and every
action on a plain vLLM server, is refused with the reason.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiops.attach.history import ConfigHistory
from aiops.attach.ray_serve import AttachError, RayServe, ServeApp, discover
from aiops.config import AttachTarget
from aiops.control_status import ControlStatus, ModelStatus, ReplicaBounds, VersionStatus
from aiops.errors import AIOpsError
from aiops.identity import app_version, deployment_version
from aiops.remediation.actions import ControlPlane, NotSupported

__all__ = ["Planes", "ServeControl", "VllmControl", "serve_status"]

log = logging.getLogger(__name__)


class _Plane(ControlPlane, Protocol):
    """A control plane remediation acts through, which ``Planes`` also closes."""

    def close(self) -> None: ...


def _bounds(app: ServeApp, deployments: list[str]) -> ReplicaBounds:
    chosen = [d for d in app.deployments if d.name in deployments] or list(app.deployments)
    for d in chosen:
        if d.autoscaling:
            lo = int(d.autoscaling.get("min_replicas", 1))
            return ReplicaBounds(min_replicas=lo,
                                 max_replicas=int(d.autoscaling.get("max_replicas", lo)))
    n = max((d.num_replicas or len(d.replicas) for d in chosen), default=1)
    return ReplicaBounds(min_replicas=n, max_replicas=n)


def _deployments_of(app: ServeApp, service: str) -> list[str]:
    """The app's deployments whose telemetry names ``service``."""
    return [d.name for d in app.deployments if app.service_of(d.name) == service] or \
        [i.deployment for i in app.identities if i.service == service]


def _version_in(config: dict[str, Any], deployments: list[str]) -> str:
    """The version a kept config gives these deployments (aiops.identity's rules)."""
    return deployment_version(config, deployments[0]) if deployments else app_version(config)


def serve_status(apps: list[ServeApp], history: ConfigHistory, target: str
                 ) -> ControlStatus:
    """Every service of every declaratively deployed app (its ingress' and each of its
    deployments'), each with its app's current and healthy releases: an incident on any
    deployment of a composed app is acted on through that app's config."""
    models: dict[str, ModelStatus] = {}
    for app in apps:
        if app.config is None:
            continue  # deployed with serve.run: nothing aiops could re-apply
        for service in app.services:
            deps = _deployments_of(app, service)
            current = app.version_of(deps[0]) if deps else app.version
            healthy = [_version_in(h.config, deps) for h in history.healthy(app.name)]
            versions = [VersionStatus(version=current, weight=100, app=app.name,
                                      deployments=deps, autoscaling=_bounds(app, deps),
                                      status=app.status)]
            versions += [VersionStatus(version=v, weight=0, app=app.name)
                         for v in dict.fromkeys(healthy) if v != current]
            models[service] = ModelStatus(stable=healthy[-1] if healthy else None,
                                          versions=versions, target=target, kind="ray",
                                          app=app.name)
    return ControlStatus(models=models)


class ServeControl:
    """One attached Ray cluster; models are the Serve applications' services."""

    def __init__(self, target: AttachTarget, history: ConfigHistory) -> None:
        self.target = target
        self.history = history
        self._rest = RayServe(target)

    def close(self) -> None:
        self._rest.close()

    def _read(self) -> tuple[dict[str, Any], list[ServeApp]]:
        details = self._rest.details()
        return details, discover(details)

    def status(self) -> ControlStatus:
        return serve_status(self._read()[1], self.history, self.target.name)

    def _app(self, apps: list[ServeApp], model: str) -> ServeApp:
        for app in apps:
            if model in app.services and app.config is not None:
                return app
        raise AttachError(f"{model} is not a service of a declaratively deployed Serve "
                          f"application on {self.target.name}")

    def rollback(self, model: str) -> dict[str, Any]:
        details, apps = self._read()
        app = self._app(apps, model)
        good = self.history.last_healthy(app.name, other_than=app.version)
        if good is None:
            raise AttachError(
                f"no healthy earlier config of Serve application {app.name} is known: aiops "
                f"keeps one after it runs {self.history.healthy_after_ns / 1e9:g} s with no "
                "incident")
        configs = [good.config if a.name == app.name else a.config for a in apps
                   if a.config is not None]
        self._rest.apply(details, configs)
        log.info("rolled %s back on %s: %s -> %s", app.name, self.target.name, app.version,
                 good.version)
        return {"model": model, "app": app.name, "from": app.version, "to": good.version,
                "target": self.target.name}

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        details, apps = self._read()
        app = self._app(apps, model)
        deps = _deployments_of(app, model)
        running = {app.version_of(d) for d in deps} or {app.version}
        if version not in running:
            raise AttachError(f"{model} ({app.name}) runs version "
                              f"{', '.join(sorted(running))}, not {version}")
        assert app.config is not None
        config = copy.deepcopy(app.config)
        listed = {d.get("name"): d for d in config.setdefault("deployments", [])}
        for dep in app.deployments:
            if deps and dep.name not in deps:
                continue  # another deployment's service: not this one to scale
            d = listed.get(dep.name)
            if d is None:
                d = {"name": dep.name}
                config["deployments"].append(d)
            if dep.autoscaling or "autoscaling_config" in d:
                auto = dict(d.get("autoscaling_config") or dep.autoscaling or {})
                auto.update(min_replicas=min_replicas, max_replicas=max_replicas)
                d["autoscaling_config"] = auto
                d.pop("num_replicas", None)
            else:
                d["num_replicas"] = min_replicas
        self._rest.apply(details, [config if a.name == app.name else a.config for a in apps
                                   if a.config is not None])
        return {"model": model, "app": app.name, "deployments": deps,
                "min_replicas": min_replicas, "max_replicas": max_replicas,
                "target": self.target.name}

    def _refuse(self, what: str) -> dict[str, Any]:
        raise NotSupported(f"{what} is not possible on attached Ray cluster "
                           f"{self.target.name}: Serve keeps one config per application "
                           "(aiops can roll it back or scale it)")

    def set_traffic(self, model: str, weights: dict[str, int]) -> dict[str, Any]:
        return self._refuse(f"shifting {model}'s traffic between versions")

    def canary(self, model: str, version: str, percent: int) -> dict[str, Any]:
        return self._refuse(f"a canary of {model}")

    def promote(self, model: str, version: str) -> dict[str, Any]:
        return self._refuse(f"promoting {model} {version}")

    def shed(self, model: str, classes: list[str]) -> dict[str, Any]:
        return self._refuse(f"shedding {model}'s {'/'.join(classes)} load")

    def restart_replica(self, model: str, version: str, replica: str | None = None
                        ) -> dict[str, Any]:
        return self._refuse(f"restarting a replica of {model}")


class VllmControl:
    """A vLLM OpenAI server aiops did not start: observed, never changed."""

    def __init__(self, target: AttachTarget, models: Callable[[], list[str]],
                 tag: Callable[[], str | None] = lambda: None) -> None:
        self.target = target
        self._models = models
        self._tag = tag  # the weights' tag, what stands for the version

    def close(self) -> None:
        pass

    def status(self) -> ControlStatus:
        return ControlStatus(models={
            m: ModelStatus(stable=None, target=self.target.name, kind="vllm",
                           versions=[VersionStatus(version=self._tag() or m, weight=100)])
            for m in self._models()})

    def _refuse(self, what: str) -> dict[str, Any]:
        raise NotSupported(f"{what}: vLLM server {self.target.name} ({self.target.url}) runs "
                           "one model with no versions or replicas aiops controls; act where "
                           "it is deployed")

    def rollback(self, model: str) -> dict[str, Any]:
        return self._refuse(f"cannot roll {model} back")

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        return self._refuse(f"cannot scale {model}")

    def set_traffic(self, model: str, weights: dict[str, int]) -> dict[str, Any]:
        return self._refuse(f"cannot shift {model}'s traffic")

    def canary(self, model: str, version: str, percent: int) -> dict[str, Any]:
        return self._refuse(f"cannot start a canary of {model}")

    def promote(self, model: str, version: str) -> dict[str, Any]:
        return self._refuse(f"cannot promote {model}")

    def shed(self, model: str, classes: list[str]) -> dict[str, Any]:
        return self._refuse(f"cannot shed {model}'s load")

    def restart_replica(self, model: str, version: str, replica: str | None = None
                        ) -> dict[str, Any]:
        return self._refuse(f"cannot restart {model}")


class Planes:
    """Every control plane aiops can act through, as one: statuses merged, each action sent
    to the plane that owns its model. A plane that cannot be read is logged and left out
    unless none can be read."""

    def __init__(self, factories: list[Callable[[], _Plane]]) -> None:
        self._factories = factories
        self._planes: list[_Plane] | None = None
        self._owner: dict[str, _Plane] = {}

    def __enter__(self) -> Planes:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for p in self._planes or []:
            p.close()
        self._planes = None

    def _all(self, errors: list[AIOpsError]) -> list[_Plane]:
        if self._planes is None:
            self._planes = []
            for make in self._factories:
                try:
                    self._planes.append(make())
                except AIOpsError as exc:  # e.g. no embedded stack: no admin token
                    errors.append(exc)
        return self._planes

    def status(self) -> ControlStatus:
        models: dict[str, ModelStatus] = {}
        errors: list[AIOpsError] = []
        for plane in self._all(errors):
            try:
                part = plane.status().models
            except AIOpsError as exc:
                errors.append(exc)
                continue
            for name, m in part.items():
                if name in models:
                    log.warning("model %s is served by two control planes; acting on the "
                                "first", name)
                    continue
                models[name] = m
                self._owner[name] = plane
        if errors and not models:
            raise errors[0]
        for err in errors:  # the others answered: one down (or absent) is not the end
            log.info("a control plane cannot be read: %s", err)
        return ControlStatus(models=models)

    def _of(self, model: str) -> _Plane:
        if model not in self._owner:
            self.status()
        if model not in self._owner:
            raise AttachError(f"no control plane serves {model}")
        return self._owner[model]

    def rollback(self, model: str) -> dict[str, Any]:
        return self._of(model).rollback(model)

    def set_traffic(self, model: str, weights: dict[str, int]) -> dict[str, Any]:
        return self._of(model).set_traffic(model, weights)

    def canary(self, model: str, version: str, percent: int) -> dict[str, Any]:
        return self._of(model).canary(model, version, percent)

    def shed(self, model: str, classes: list[str]) -> dict[str, Any]:
        return self._of(model).shed(model, classes)

    def restart_replica(self, model: str, version: str, replica: str | None = None
                        ) -> dict[str, Any]:
        return self._of(model).restart_replica(model, version, replica)

    def promote(self, model: str, version: str) -> dict[str, Any]:
        return self._of(model).promote(model, version)

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        return self._of(model).scale(model, version, min_replicas, max_replicas)

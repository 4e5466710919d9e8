"""A Ray cluster aiops did not start, through its dashboard's Serve REST API.

``GET /api/serve/applications/`` lists applications, deployments, replicas and each app's
``deployed_app_config``; ``PUT`` of the same path applies a whole declarative config (apps
missing from it are deleted, so a change to one app re-sends every app's config). Ray's token
auth (``RAY_AUTH_MODE=token``) wants ``Authorization: Bearer <token>``.

Services and versions follow the identity rules of ``aiops.identity`` (one place for them,
shared with the tracing exporter inside the replicas).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from aiops.analytics.topology import ServiceMap
from aiops.config import AttachTarget
from aiops.errors import AIOpsError, StackError
from aiops.identity import (
    ServeIdentity,
    app_version,
    deployment_service,
    identities,
    ingress_of,
)

__all__ = ["AttachError", "Deployment", "RayServe", "ServeApp", "app_service", "app_version",
           "discover", "service_map"]

PATH = "/api/serve/applications/"
# The dashboard refuses writes from anything that looks like a browser (User-Agent Mozilla,
# Origin, Referer): say who we are.
USER_AGENT = "aiops-attach/0.1"
MAX_RESPONSE_BYTES = 32 * 2**20


class AttachError(AIOpsError):
    """An attached target refused a request or answered something aiops cannot use."""


@dataclass(frozen=True)
class Deployment:
    name: str
    status: str
    replicas: tuple[str, ...]
    num_replicas: int | None
    autoscaling: dict[str, Any] | None
    # (replica id, pid, node address) of the running replicas: what the eBPF collector on
    # that node attributes kernel measurements with.
    processes: tuple[tuple[str, int, str | None], ...] = ()


@dataclass(frozen=True)
class ServeApp:
    name: str
    service: str
    version: str
    status: str
    config: dict[str, Any] | None  # None: deployed imperatively (serve.run), not re-appliable
    deployments: tuple[Deployment, ...] = field(default_factory=tuple)
    last_deployed_s: float = 0.0
    # Serve's deployment graph: (deployment, called app, called deployment), from the handles
    # each deployment holds (``deployment_topology``, Ray >= 2.50).
    outbound: tuple[tuple[str, str, str], ...] = ()
    # Each deployment's service and version (aiops.identity).
    identities: tuple[ServeIdentity, ...] = ()

    def _identity(self, deployment: str) -> ServeIdentity | None:
        return next((i for i in self.identities if i.deployment == deployment), None)

    def service_of(self, deployment: str) -> str:
        ident = self._identity(deployment)
        return ident.service if ident else self.service

    def version_of(self, deployment: str) -> str:
        ident = self._identity(deployment)
        return ident.version if ident else self.version

    @property
    def services(self) -> tuple[str, ...]:
        """Every service the app's telemetry names: its ingress' and each deployment's."""
        return tuple(dict.fromkeys([self.service, *(i.service for i in self.identities)]))

    def releases(self) -> set[tuple[str, str]]:
        """(service, version) of every deployment: what an incident on this release names."""
        return {(self.service, self.version), *((i.service, i.version)
                                                for i in self.identities)}


def app_service(name: str, config: dict[str, Any] | None) -> str:
    """The service of the app's ingress: what its clients call."""
    return deployment_service(name, "", config, ingress=True)


def discover(details: dict[str, Any]) -> list[ServeApp]:
    """ServeInstanceDetails (the GET answer) -> applications."""
    apps = details.get("applications")
    if not isinstance(apps, dict):
        raise AttachError("the Serve REST API answered without an 'applications' object")
    out = []
    for name, app in sorted(apps.items()):
        config = app.get("deployed_app_config")
        deps = []
        for dname, d in sorted((app.get("deployments") or {}).items()):
            dcfg = d.get("deployment_config") or {}
            running = [r for r in d.get("replicas") or [] if r.get("state") == "RUNNING"]
            deps.append(Deployment(
                dname, str(d.get("status", "")), tuple(r["replica_id"] for r in running),
                d.get("target_num_replicas", dcfg.get("num_replicas")),
                dcfg.get("autoscaling_config"),
                tuple((str(r["replica_id"]), int(r["pid"]), r.get("node_ip"))
                      for r in running if isinstance(r.get("pid"), int))))
        version = app_version(config) if config else "imperative"
        idents = identities(name, app)
        ingress = idents.get(ingress_of(app) or "")
        service = ingress.service if ingress else app_service(name, config)
        out.append(ServeApp(name, service, version, str(app.get("status", "")),
                            config, tuple(deps), float(app.get("last_deployed_time_s") or 0),
                            _outbound(app.get("deployment_topology")),
                            tuple(idents.values())))
    return out


def _outbound(topology: Any) -> tuple[tuple[str, str, str], ...]:
    nodes = topology.get("nodes") if isinstance(topology, dict) else None
    if not isinstance(nodes, dict):
        return ()
    edges = []
    for dname, node in nodes.items():
        for callee in (node.get("outbound_deployments") or [])[:1000] \
                if isinstance(node, dict) else []:
            if isinstance(callee, dict) and callee.get("name") and callee.get("app_name"):
                edges.append((str(dname), str(callee["app_name"]), str(callee["name"])))
    return tuple(sorted(set(edges)))


def service_map(apps: list[ServeApp]) -> ServiceMap:
    """Who calls whom among the services the apps' telemetry names, from Serve's deployment
    graph: a deployment's calls into another app (or into a deployment of its own app that
    reports its own service) become caller -> callee service edges."""
    by_name = {a.name: a for a in apps}
    edges = set()
    for app in apps:
        for dname, callee_app, callee in app.outbound:
            target = by_name.get(callee_app)
            if target is None:
                continue
            a, b = app.service_of(dname), target.service_of(callee)
            if a != b:
                edges.add((a, b))
    return ServiceMap(frozenset(edges))


class RayServe:
    """Client of one Ray cluster's Serve REST API."""

    def __init__(self, target: AttachTarget, timeout_s: float = 10.0) -> None:
        self.target = target
        self._http = httpx.Client(base_url=target.url.rstrip("/"), timeout=timeout_s,
                                  headers={"user-agent": USER_AGENT})

    def __enter__(self) -> RayServe:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _headers(self) -> dict[str, str]:
        token = self.target.token()
        return {"authorization": f"Bearer {token}"} if token else {}

    def _call(self, method: str, body: Any = None) -> httpx.Response:
        try:
            resp = self._http.request(method, PATH, headers=self._headers(),
                                      content=None if body is None else orjson.dumps(body))
        except httpx.HTTPError as exc:
            raise StackError(f"cannot reach Ray's dashboard at {self.target.url} "
                             f"({self.target.name}): {exc}") from exc
        if resp.status_code in (401, 403):
            raise AttachError(f"Ray's dashboard at {self.target.url} refused aiops' request "
                              f"(HTTP {resp.status_code}): set token_file of target "
                              f"{self.target.name} to the cluster's auth token")
        if resp.status_code >= 400:
            raise AttachError(f"Ray's Serve API at {self.target.url} answered HTTP "
                              f"{resp.status_code}: {resp.text[:500]}")
        if len(resp.content) > MAX_RESPONSE_BYTES:
            raise AttachError(f"Ray's Serve API at {self.target.url} answered "
                              f"{len(resp.content)} bytes, over {MAX_RESPONSE_BYTES}")
        return resp

    def details(self) -> dict[str, Any]:
        try:
            out: dict[str, Any] = self._call("GET").json()
        except ValueError as exc:
            raise AttachError(f"Ray's Serve API at {self.target.url} answered non-JSON") \
                from exc
        return out

    def applications(self) -> list[ServeApp]:
        return discover(self.details())

    def apply(self, details: dict[str, Any], configs: list[dict[str, Any]]) -> None:
        """PUT a declarative config of these applications (the whole set), keeping the
        cluster's proxy and HTTP options as ``details`` (a GET answer) reports them."""
        body: dict[str, Any] = {"applications": configs}
        for key in ("proxy_location", "http_options"):
            if details.get(key) is not None:
                body[key] = details[key]
        self._call("PUT", body)

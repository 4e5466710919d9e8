"""Who calls whom, when traces do not say: a declared service map.

An attached stack often has metrics but few or no traces between its services, so the call
edges that root-cause ranking uses to tell a symptom (a caller slowed by its callee) from a
cause cannot be read off spans. A service map names them instead, as YAML or JSON::

    calls:
      front-end: [orders, carts, catalogue, user]
      orders: [payment, shipping, carts, user]

Edges from traces and from the map are used together; the map never removes an edge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from aiops.errors import ConfigError

__all__ = ["ServiceMap", "load_service_map"]

MAX_BYTES = 1 * 2**20
MAX_EDGES = 10_000
_NAME = re.compile(r"^[A-Za-z0-9_.:/@-]{1,200}$")


@dataclass(frozen=True)
class ServiceMap:
    edges: frozenset[tuple[str, str]] = frozenset()

    def __or__(self, other: ServiceMap) -> ServiceMap:
        return ServiceMap(self.edges | other.edges)

    def callees(self, service: str) -> set[str]:
        """Every service ``service`` reaches through calls (transitively), itself excluded."""
        out: set[str] = set()
        todo = [service]
        while todo:
            here = todo.pop()
            for caller, callee in self.edges:
                if caller == here and callee != service and callee not in out:
                    out.add(callee)
                    todo.append(callee)
        return out


def parse_service_map(doc: object, where: str) -> ServiceMap:
    calls = doc.get("calls") if isinstance(doc, dict) else None
    if not isinstance(calls, dict):
        raise ConfigError(f"{where}: expected a mapping 'calls: {{caller: [callee, ...]}}'")
    edges = set()
    for caller, callees in calls.items():
        if not isinstance(callees, list):
            raise ConfigError(f"{where}: calls.{caller} must be a list of services")
        for callee in callees:
            for name in (caller, callee):
                if not isinstance(name, str) or not _NAME.match(name):
                    raise ConfigError(f"{where}: {name!r} is not a service name")
            edges.add((caller, callee))
    if len(edges) > MAX_EDGES:
        raise ConfigError(f"{where}: {len(edges)} edges, over {MAX_EDGES}")
    return ServiceMap(frozenset(edges))


def load_service_map(path: Path | None) -> ServiceMap:
    """The map in ``path`` (YAML or JSON); an empty map for None."""
    if path is None:
        return ServiceMap()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read service map {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"service map {path} is {len(raw)} bytes, over {MAX_BYTES}")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"service map {path} is not YAML/JSON: {exc}") from exc
    return parse_service_map(doc, str(path))

"""Who calls whom, when traces do not say: a declared service map.

An attached stack often has metrics but few or no traces between its services, so the call
edges that root-cause ranking uses to tell a symptom (a caller slowed by its callee) from a
cause cannot be read off spans. A service map names them instead, as YAML or JSON::

    calls:
      front-end: [orders, carts, catalogue, user]
      orders: [payment, shipping, carts, user]

Mesh metrics give calls too: a series labelled with its source and destination (Istio's
``source_workload`` / ``destination_workload``, or their ``*_canonical_service``) is a call
between the two; ``mesh_calls`` reads them from what the server scraped.

Edges from traces, the map, Serve's deployment graph (aiops.attach) and the mesh are used
together; no source removes an edge another gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from aiops.errors import AIOpsError, ConfigError
from aiops.store import Store

__all__ = ["ServiceMap", "load_service_map", "mesh_calls"]

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


_MESH = f"""
SELECT DISTINCT src, dst FROM (
  SELECT coalesce(attributes->>'source_canonical_service', (attributes->>'source_workload')) AS src,
         coalesce(attributes->>'destination_canonical_service',
                  (attributes->>'destination_workload')) AS dst
  FROM metric_points
  WHERE time >= make_timestamp_ns(?) AND (attributes->>'destination_workload') IS NOT NULL)
WHERE src IS NOT NULL AND dst IS NOT NULL AND src <> dst
  AND src <> 'unknown' AND dst <> 'unknown'
LIMIT {MAX_EDGES}
"""


def mesh_calls(store: Store, since_ns: int) -> ServiceMap:
    """Calls seen in mesh metrics since ``since_ns`` (Istio's labels; ``unknown``, its name
    for a peer outside the mesh, is no service). An unreadable store gives no calls: the
    other sources still do."""
    try:
        rows = store.query(_MESH, [since_ns]).rows
    except AIOpsError:
        return ServiceMap()
    return ServiceMap(frozenset((str(a), str(b)) for a, b in rows
                                if _NAME.match(str(a)) and _NAME.match(str(b))))

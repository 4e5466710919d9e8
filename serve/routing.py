"""Traffic between the versions of a model: weighted split, optional stickiness.

The ingress rebuilds its routes from the routing table it receives in place (Serve
``user_config``); admission gates survive a rebuild so in-flight counts stay true. A request
carrying the sticky header always lands on the same version for the same weights (its value is
hashed onto the 0-100 line the weights divide); others are split at random. A version whose
weight drops to 0 hands its waiting (not yet started) requests back to be routed again.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from serve.admission import AdmissionController
from serve.specs import ModelSpec, Priority

__all__ = ["ModelRoute", "NoVersionServing", "Version", "build_routes"]


class NoVersionServing(Exception):
    """Every version of the model has weight 0."""


@dataclass
class Version:
    spec: ModelSpec
    app: str
    deployment: str
    weight: int
    digest: str
    gate: AdmissionController
    validator: jsonschema.Draft202012Validator | None
    handle: Any
    shed: frozenset[Priority] = frozenset()  # priority classes refused while load is shed

    @property
    def version(self) -> str:
        return self.spec.version


@dataclass
class ModelRoute:
    name: str
    versions: list[Version]

    def pick(self, sticky: str | None = None, rng: random.Random | None = None) -> Version:
        live = [v for v in self.versions if v.weight > 0]
        if not live:
            raise NoVersionServing(f"no version of model {self.name!r} takes traffic")
        if sticky:
            digest = hashlib.sha256(f"{self.name}\0{sticky}".encode()).digest()
            point = int.from_bytes(digest[:8], "big") % 10_000 / 100
        else:
            point = (rng or random).uniform(0, 100)
        total = 0.0
        scale = 100 / sum(v.weight for v in live)
        for v in live:
            total += v.weight * scale
            if point < total:
                return v
        return live[-1]

    @property
    def primary(self) -> Version:
        """The version with the most traffic (what /v1/models reports)."""
        return max(self.versions, key=lambda v: v.weight)


def _capacity(spec: ModelSpec) -> int:
    return spec.autoscaling.max_replicas * spec.max_ongoing_requests


def _class_caps(spec: ModelSpec) -> dict[Priority, int]:
    cap = spec.qos.batch_max_in_flight
    return {} if cap is None else {Priority.BATCH: cap}


def build_routes(table: dict[str, Any], previous: dict[str, ModelRoute],
                 get_handle: Callable[[str, str], Any]) -> dict[str, ModelRoute]:
    gates = {v.deployment: v.gate for r in previous.values() for v in r.versions}
    weights = {v.deployment: v.weight for r in previous.values() for v in r.versions}
    handles = {v.deployment: v.handle for r in previous.values() for v in r.versions}
    routes: dict[str, ModelRoute] = {}
    for name, entries in table["models"].items():
        versions = []
        for e in entries:
            spec = ModelSpec.model_validate(e["spec"])
            gate = gates.get(e["deployment"])
            if gate is None:
                gate = AdmissionController(_capacity(spec),
                                           {p: spec.qos.max_queue for p in Priority},
                                           max_in_flight=_class_caps(spec))
            else:  # keep the live counters, take the new limits
                gate.capacity = _capacity(spec)
                gate.max_queue = {p: spec.qos.max_queue for p in Priority}
                gate.max_in_flight = _class_caps(spec)
            handle = handles.get(e["deployment"]) or get_handle(e["deployment"], e["app"])
            validator = (jsonschema.Draft202012Validator(spec.input_schema)
                         if spec.input_schema else None)
            if int(e["weight"]) == 0 and weights.get(e["deployment"], 0) > 0:
                gate.reroute_waiting()  # rolled back: its queue goes to the serving version
            versions.append(Version(spec, e["app"], e["deployment"], int(e["weight"]),
                                    e["digest"], gate, validator, handle,
                                    frozenset(Priority(p) for p in e.get("shed", ()))))
        routes[name] = ModelRoute(name, versions)
    return routes

"""What a model version is given, as values: the limits an answer measures use against.

A model's spec states them (``resources.memory_mb``, ``qos.max_queue``;
``serve.specs.capacities_from_specs`` reads them); the agent's saturation answers say use
relative to them ("410 MB of its 512 MB reservation") instead of bare figures.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capacity"]


@dataclass(frozen=True)
class Capacity:
    model: str
    memory_mb: int | None = None  # Ray's memory reservation per replica
    max_queue: int | None = None  # requests of one class that may wait at the ingress

"""What a model version is given, as values: the limits an answer measures use against, and
the replicas a load needs under them.

A model's spec states them (``resources.memory_mb``, ``qos.max_queue``, the autoscaling
bounds and target, ``max_ongoing_requests``; ``serve.specs.capacities_from_specs`` reads
them); the agent's answers say use relative to them ("410 MB of its 512 MB reservation") and
whether a load fits them (``plan``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Capacity", "Fit", "Plan", "plan"]


@dataclass(frozen=True)
class Capacity:
    model: str
    memory_mb: int | None = None  # Ray's memory reservation per replica
    max_queue: int | None = None  # requests of one class that may wait at the ingress
    min_replicas: int | None = None  # the autoscaler's bounds
    max_replicas: int | None = None
    target_ongoing: float | None = None  # requests in service per replica it scales for
    max_ongoing: int | None = None  # requests one replica takes at once; more wait
    num_cpus: float | None = None  # Ray CPUs each replica reserves


class Fit(StrEnum):
    FITS = "fits"  # the autoscaler's replicas, within max_replicas, serve it at target
    ABOVE_TARGET = "above_target"  # max_replicas take it, each above the autoscaling target
    OVER = "over"  # more than every replica's slots: requests queue, then are refused


@dataclass(frozen=True)
class Plan:
    """A load ``in_service`` (requests in service at once) against a model's limits."""

    in_service: float
    replicas: int  # what Serve's autoscaler asks for: ceil(in_service / target), in bounds
    wanted: int  # the same without the max_replicas bound
    fit: Fit
    headroom_target: float | None  # load multiple max_replicas serve at target
    headroom_slots: float | None  # load multiple before every slot is taken


def plan(in_service: float, cap: Capacity) -> Plan | None:
    """How a model's replicas take ``in_service`` requests in service at once, by Serve's own
    rule (desired replicas = ceil(ongoing / target_ongoing_requests), bounded by
    min/max_replicas); None when the spec gives no autoscaling target or bound."""
    if cap.target_ongoing is None or cap.max_replicas is None:
        return None
    wanted = max(math.ceil(in_service / cap.target_ongoing - 1e-9), cap.min_replicas or 0, 1)
    replicas = min(wanted, cap.max_replicas)
    slots = cap.max_replicas * cap.max_ongoing if cap.max_ongoing else None
    if wanted <= cap.max_replicas:
        fit = Fit.FITS
    elif slots is None or in_service <= slots:
        fit = Fit.ABOVE_TARGET
    else:
        fit = Fit.OVER
    at_target = cap.max_replicas * cap.target_ongoing
    return Plan(in_service, replicas, wanted, fit,
                at_target / in_service if in_service > 0 else None,
                slots / in_service if slots and in_service > 0 else None)

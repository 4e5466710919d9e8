"""What an SLO is, as values: a model's objectives and the burn-rate window pairs.

A model's spec states its objectives (``qos.slo``; ``serve.specs.objectives_from_specs`` reads
them), ``analytics_burn_windows`` the window pairs; the live detector
(``aiops.analytics.slo``) and the dashboards (``dashboards.slo``) both take them as these
values, so neither needs the other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BurnWindow", "Objective", "parse_windows"]


@dataclass(frozen=True)
class BurnWindow:
    long_s: float
    short_s: float
    threshold: float


@dataclass(frozen=True)
class Objective:
    model: str
    latency_ms: float | None = None
    latency_budget: float = 0.05  # share of requests allowed above latency_ms
    error_budget: float | None = None  # share of requests allowed to fail


def parse_windows(text: str) -> list[BurnWindow]:
    """``"60/10/6,600/60/3"``: long seconds / short seconds / burn threshold, comma-separated."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        long_s, short_s, threshold = (float(x) for x in part.split("/"))
        if not 0 < short_s < long_s or threshold <= 0:
            raise ValueError(f"burn window {part!r}: need 0 < short < long and threshold > 0")
        out.append(BurnWindow(long_s, short_s, threshold))
    return out

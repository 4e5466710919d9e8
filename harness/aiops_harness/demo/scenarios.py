"""The demo's incidents: what is injected where, and what a correct diagnosis says.

A scenario either ships a bad canary (a v2 of the chat model, same weights, with an injected
fault, on part of the traffic) or breaks the serving version in place. Faults act on the
request path only; the analytics see their effects (slow or failed requests, busy CPUs, a
dying process), never a label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiops_harness.demo.traffic import CHAT, EMBED

__all__ = ["DEFAULT", "ORDER", "SCENARIOS", "Scenario"]


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    model: str
    faults: dict[str, Any]
    expect_fault: tuple[str, ...]  # fault classes a right diagnosis may name
    canary_percent: int | None = None  # a v2 canary on this share of traffic; None: v1 itself
    slo_s: float = 4.0  # a client-side request slower than this counts as bad
    # With no executed action (none planned, or the policy said no), the demo's "operator"
    # removes the fault this long after detection (None: there is no fault to remove).
    operator_fix_after_s: float | None = 10.0
    notes: list[str] = field(default_factory=list)
    # A Ray worker node whose raylet is killed; ``model`` is then whichever model had a
    # replica there (read when the scenario starts), and the stack runs worker nodes.
    lose_node: str | None = None

    @property
    def worker_nodes(self) -> int:
        return 1 if self.lose_node else 0

    @property
    def version(self) -> str:
        return "v2" if self.canary_percent is not None else "v1"


SCENARIOS = {s.name: s for s in (
    Scenario("canary", "a v2 canary of the chat model answers 5 s slower", CHAT,
             {"latency_ms": 5000}, ("latency",), canary_percent=30),
    Scenario("error-burst", "a v2 canary of the chat model fails half its requests", CHAT,
             {"error_rate": 0.5}, ("errors",), canary_percent=30),
    Scenario("crash", "the embedding model's replica crashes every 10 requests", EMBED,
             {"crash_after": 10}, ("crash",), slo_s=2.0),
    Scenario("cpu", "the embedding model burns 150 ms of CPU per request", EMBED,
             {"cpu_burn_ms": 150}, ("cpu",), slo_s=0.5),
    Scenario("memory", "the embedding model leaks 8 MiB per request", EMBED,
             {"memory_growth_mb": 8}, ("memory",), slo_s=0.15,
             notes=["The leak shows in no SLI until the kernel kills the replica: it is found "
                    "in the replica's resident memory (the eBPF collector reads it from /proc)."]),
    Scenario("node-loss", "the Ray worker node's raylet is killed, its replicas with it",
             "", {}, ("node",), operator_fix_after_s=None, lose_node="worker-1",
             notes=["The stack runs a head and a worker node (ray_worker_nodes=1); Serve "
                    "reschedules the lost replicas on the head, and the incident resolves "
                    "once they run there."]),
)}
DEFAULT = "canary"
# `all` runs them in this order: the two canaries far apart, so the demo policy's rollback
# cooldown (120 s) has passed by the second; the crash after cpu and memory, whose detectors
# judge a replica against its own past (a restarted replica has none for a minute). It
# leaves node-loss out: that one needs worker nodes (`--scenario node-loss` starts them).
ORDER = ("canary", "cpu", "memory", "crash", "error-burst")

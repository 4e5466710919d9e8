"""The call graph's roles, read the same way by the symptom walk and the combiner: who calls
whom, and which nodes only relay a call (one caller, one callee: a load balancer, a gateway, a
function's trigger)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["CallGraph"]


@dataclass
class CallGraph:
    callees: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    callers: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def of(cls, edges: Iterable[tuple[str, str]]) -> CallGraph:
        """From (caller, callee) pairs; a node calling itself is no edge."""
        g = cls()
        for caller, callee in edges:
            if caller != callee:
                g.callees[caller].add(callee)
                g.callers[callee].add(caller)
        return g

    def relay(self, node: str) -> bool:
        return len(self.callers[node]) == 1 and len(self.callees[node]) == 1

    def through(self, node: str, stop: Callable[[str], bool]) -> tuple[str, int]:
        """From ``node`` on along relays until ``stop`` holds or a node is no relay: the node
        reached and the calls passed on the way."""
        seen: set[str] = set()
        hops = 0
        while not stop(node) and node not in seen and self.relay(node):
            seen.add(node)
            node, hops = next(iter(self.callees[node])), hops + 1
        return node, hops

    def depth(self, node: str) -> int:
        """How many calls lie below ``node`` on its longest acyclic path."""
        seen: set[str] = set()

        def down(n: str) -> int:
            if n in seen:
                return 0
            seen.add(n)
            d = 1 + max((down(c) for c in self.callees.get(n, ())), default=-1)
            seen.discard(n)
            return d

        return down(node)

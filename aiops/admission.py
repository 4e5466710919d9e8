"""What one caller may hold at once, counted across every listener.

The HTTP gate and the OTLP/gRPC receiver admit a request only once its caller is known; each
then takes a slot of its principal (a named token) here for as long as the request runs, so a
token's requests in flight are bounded whichever door they come through: a leaked or runaway
token cannot hold every worker, stream and connection of the server, and everyone else's
requests still run. Anonymous callers (loopback, by configuration) are not counted here: their
address's connection cap bounds them.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["PrincipalSlots"]


class PrincipalSlots:
    def __init__(self, per_principal: int) -> None:
        self.per_principal = per_principal
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.refused = 0

    def take(self, principal: str) -> bool:
        """A slot for one request of ``principal``; False when it holds its share already."""
        if not principal or principal == "anonymous":
            return True
        with self._lock:
            if self._held[principal] >= self.per_principal:
                self.refused += 1
                return False
            self._held[principal] += 1
            return True

    def give(self, principal: str) -> None:
        if not principal or principal == "anonymous":
            return
        with self._lock:
            self._held[principal] -= 1
            if self._held[principal] <= 0:
                del self._held[principal]

    def held(self, principal: str) -> int:
        with self._lock:
            return self._held[principal]

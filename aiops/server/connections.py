"""Connections before auth: none may sit on the server for free.

uvicorn closes a keep-alive connection idle between requests, but not one that never sends a
request, or sends its headers a byte a minute: those hold a file descriptor and a slot for as
long as the client likes, and enough of them starve /readyz and ingest. This protocol (uvicorn's
own, with two limits) closes a connection whose request headers are not complete within
``header_timeout_s`` of its opening or of its previous response, and refuses (503, closed) a
connection past ``per_client`` open ones from the same address.

Many addresses each under ``per_client`` can still fill the server's connection limit
(uvicorn's ``limit_concurrency``: past it every new request gets 503, /readyz included) with
connections that never send a request. So when a new connection comes to a full server, the
connection idle the longest (no request in flight: never sent one, or between keep-alive
requests) is closed to make room: an idle connection costs its holder nothing to reopen, and a
client that sends its request at once is never the one closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aiops.config import Settings

__all__ = ["GuardedHttpProtocol", "uvicorn_config"]

log = logging.getLogger(__name__)

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
         b"retry-after: 1\r\nconnection: close\r\ncontent-length: 58\r\n\r\n"
         b'{"error": "too many connections from this address; retry"}')


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a per-address cap; each
    server gets a subclass of its own (``uvicorn_config``), with its limits and counts."""

    header_timeout_s: float = 10.0
    per_client: int = 256
    open_by_client: Counter[str] = Counter()
    # Connections with no request in flight, the longest idle first (a subclass' own).
    idle: OrderedDict[GuardedHttpProtocol, None] = OrderedDict()
    evicted = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted = ""
        peer = self.client[0] if self.client else ""
        if self.open_by_client[peer] >= self.per_client:
            log.warning("refused a connection from %s: %d open", peer, self.per_client)
            transport.write(_BUSY)
            transport.close()
            return
        self.open_by_client[peer] += 1
        self._counted = peer or "?"
        self._make_room()
        self._arm()

    def _make_room(self) -> None:
        """On a full server, close the connection idle the longest (see the module's doc)."""
        limit = self.limit_concurrency
        if limit is None:
            return
        # One out per one in.
        if len(self.connections) < limit:
            return
        for oldest in self.idle:
            if oldest is not self:
                self.idle.pop(oldest)
                type(self).evicted += 1
                oldest._too_slow()
                # Out of the count now, not once its loss is processed: this connection's
                # request may be read first (uvicorn's connection_lost discards it again).
                self.connections.discard(oldest)
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        self._disarm()
        if getattr(self, "_counted", ""):
            peer = "" if self._counted == "?" else self._counted
            self.open_by_client[peer] -= 1
            if self.open_by_client[peer] <= 0:
                del self.open_by_client[peer]
            self._counted = ""
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request's headers get the same deadline (unless one is already running).
        if not self.transport.is_closing() and (self.cycle is None
                                                 or self.cycle.response_complete):
            self._arm()

    def _arm(self) -> None:
        """Waiting for a request's headers: idle (evictable) and on the header deadline."""
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)
        self.idle[self] = None

    def _disarm(self) -> None:
        self.idle.pop(self, None)
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: Any, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's configuration for the aiops server: the guarded protocol and its limits."""
    protocol = type("ServerHttpProtocol", (GuardedHttpProtocol,), {
        "header_timeout_s": settings.server_header_timeout_s,
        "per_client": settings.server_max_connections_per_client,
        "open_by_client": Counter(), "idle": OrderedDict(), "evicted": 0})
    # No WebSocket route exists; an upgrade would hand the connection to a protocol that
    # neither times out nor gives its count back.
    return uvicorn.Config(app, host=settings.server_host, port=settings.server_port,
                          http=protocol, ws="none",
                          limit_concurrency=settings.server_max_connections,
                          timeout_keep_alive=5, **kwargs)

"""Connections before auth: none may sit on the server for free.

uvicorn closes a keep-alive connection idle between requests, but not one that never sends a
request, or sends its headers a byte a minute: those hold a file descriptor and a slot for as
long as the client likes, and enough of them starve /readyz and ingest. This protocol (uvicorn's
own, with two limits) closes a connection whose request headers are not complete within
``header_timeout_s`` of its opening or of its previous response, and refuses (503, closed) a
connection past ``per_client`` open ones from the same address.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
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
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
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
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
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
        "open_by_client": Counter()})
    # No WebSocket route exists; an upgrade would hand the connection to a protocol that
    # neither times out nor gives its count back.
    return uvicorn.Config(app, host=settings.server_host, port=settings.server_port,
                          http=protocol, ws="none",
                          limit_concurrency=settings.server_max_connections,
                          timeout_keep_alive=5, **kwargs)

"""Connections before auth: none may sit on the server for free.

uvicorn closes a keep-alive connection idle between requests, but not one that never sends a
request, or sends its headers a byte a minute: those hold a file descriptor and a slot for as
long as the client likes, and enough of them starve /readyz and ingest. This protocol (uvicorn's
own, with two limits) closes a connection whose request headers are not complete within
``header_timeout_s`` of its opening or of its previous response, and refuses (503, closed) a
connection past ``per_client`` open ones from the same address.

The counts are the server's connection gate's (``aiops.admission.ConnectionGate``), which every
listener shares: the per-address cap and the server's cap count HTTP and OTLP/gRPC together.
Many addresses each under ``per_client`` can still fill the server with connections that never
send a request; so when a new connection comes to a full server, on any listener, the HTTP
connection idle the longest (no request in flight: never sent one, or between keep-alive
requests) is closed to make room: an idle connection costs its holder nothing to reopen, and a
client that sends its request at once is never the one closed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aiops.admission import ConnectionGate, Ticket
from aiops.config import Settings

__all__ = ["GuardedHttpProtocol", "connection_gate", "uvicorn_config"]

log = logging.getLogger(__name__)


def _busy(why: str) -> bytes:
    body = (b'{"error": "too many connections from this address; retry"}' if why == "source"
            else b'{"error": "the server holds all the connections it may; retry"}')
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and the server's connection gate;
    each server gets a subclass of its own (``uvicorn_config``), with its limits and state."""

    header_timeout_s: float = 10.0
    gate: ConnectionGate = ConnectionGate(4096, 256)
    # Connections with no request in flight, the longest idle first (a subclass' own); the
    # lock because another listener's thread may take one to make room (``make_room``).
    idle: OrderedDict[GuardedHttpProtocol, None] = OrderedDict()
    lock = threading.Lock()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._ticket: Ticket | None = None
        peer = self.client[0] if self.client else "?"
        admitted = self.gate.admit("http", peer)
        if isinstance(admitted, str):
            log.warning("refused a connection from %s: %s", peer,
                        "its address holds its share" if admitted == "source"
                        else "the server is full")
            transport.write(_busy(admitted))
            transport.close()
            return
        self._ticket = admitted
        self._arm()

    @classmethod
    def make_room(cls) -> Ticket | None:
        """Close the connection idle the longest (see the module's doc); its ticket, counted
        out now: the close itself runs on this server's loop."""
        with cls.lock:
            if not cls.idle:
                return None
            oldest, _ = cls.idle.popitem(last=False)
        ticket = oldest._ticket
        try:
            here = asyncio.get_running_loop() is oldest.loop
        except RuntimeError:
            here = False
        if here:  # a new HTTP connection: out of uvicorn's count before its request is read
            oldest._evicted()
        else:
            oldest.loop.call_soon_threadsafe(oldest._evicted)
        return ticket

    def _evicted(self) -> None:
        self._too_slow()
        # Out of uvicorn's count now, not once its loss is processed (its limit_concurrency).
        self.connections.discard(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        ticket: Ticket | None = getattr(self, "_ticket", None)
        if ticket is not None:
            ticket.release()  # a no-op when make_room counted it out already
            self._ticket = None
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
        with self.lock:
            self.idle[self] = None

    def _disarm(self) -> None:
        with self.lock:
            self.idle.pop(self, None)
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def connection_gate(settings: Settings) -> ConnectionGate:
    """The server's connection gate: every listener's connections counted together."""
    return ConnectionGate(settings.server_max_connections,
                          settings.server_max_connections_per_client)


def uvicorn_config(app: Any, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's configuration for the aiops server: the guarded protocol, on the app's
    connection gate (``app.state.connections``, shared with its gRPC receiver) or a new one."""
    state = getattr(app, "state", None)
    gate = getattr(state, "connections", None) or connection_gate(settings)
    protocol: type[GuardedHttpProtocol] = type("ServerHttpProtocol", (GuardedHttpProtocol,), {
        "header_timeout_s": settings.server_header_timeout_s, "gate": gate,
        "idle": OrderedDict(), "lock": threading.Lock()})
    gate.on_full(protocol.make_room)
    # No WebSocket route exists; an upgrade would hand the connection to a protocol that
    # neither times out nor gives its count back. uvicorn's own limit (past it every request
    # gets 503) stays a backstop above the gate's: its set still holds, for a moment, the
    # connections refused or closed from another listener's thread.
    return uvicorn.Config(app, host=settings.server_host, port=settings.server_port,
                          http=protocol, ws="none",
                          limit_concurrency=settings.server_max_connections + 64,
                          timeout_keep_alive=5, **kwargs)

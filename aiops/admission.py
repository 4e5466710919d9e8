"""What one caller may hold at once, counted across every listener.

Connections (``ConnectionGate``): every listener (the HTTP server, the OTLP/gRPC receiver's
relay, any later one) asks here before it takes a connection in, so the server's connection
cap and each source address's cap count all doors together: an address cannot hold its share
on HTTP and again on gRPC, and idle connections on one door cannot lock callers out of the
other. A full server makes room by closing a connection that is idle (no request in flight)
on whichever listener has one; a caller that sends its request at once is never the one closed.

Requests (``PrincipalSlots``): the HTTP gate and the OTLP/gRPC receiver admit a request only
once its caller is known; each then takes a slot of its principal (a named token) here for as
long as the request runs, so a token's requests in flight are bounded whichever door they come
through: a leaked or runaway token cannot hold every worker, stream and connection of the
server, and everyone else's requests still run. Anonymous callers (loopback, by configuration)
are not counted here: their address's connection cap bounds them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable

__all__ = ["AdmittedRelay", "ConnectionGate", "PrincipalSlots", "Ticket"]

log = logging.getLogger(__name__)


class Ticket:
    """One connection let in; ``release`` (once, from any thread) gives its place back."""

    __slots__ = ("_gate", "listener", "open", "source")

    def __init__(self, gate: ConnectionGate, listener: str, source: str) -> None:
        self._gate, self.listener, self.source, self.open = gate, listener, source, True

    def release(self) -> None:
        self._gate._release(self)


# A listener's way to make room: close one of its idle connections (from any thread; the
# close itself may happen later on the listener's own loop) and hand back its ticket, or None.
MakeRoom = Callable[[], Ticket | None]


class ConnectionGate:
    """Connections open at once, every listener together: ``total`` in all and ``per_source``
    from one address. Thread-safe: each listener runs on a loop of its own."""

    def __init__(self, total: int, per_source: int) -> None:
        self.total, self.per_source = total, per_source
        self._by_source: Counter[str] = Counter()
        self._by_listener: Counter[str] = Counter()
        self._open = 0
        self._lock = threading.Lock()
        self._make_room: list[MakeRoom] = []
        self.refused: Counter[str] = Counter()  # by reason: source, full
        self.evicted = 0
        self.on_refused: Callable[[str], None] = lambda _why: None  # e.g. a metric

    def on_full(self, make_room: MakeRoom) -> None:
        """Register a listener that can give up an idle connection when the server is full."""
        self._make_room.append(make_room)

    def admit(self, listener: str, source: str) -> Ticket | str:
        """A ticket for a new connection from ``source``, or why it is refused: ``source``
        (that address holds its share) or ``full`` (no idle connection to close anywhere)."""
        with self._lock:
            refused_source = self._by_source[source] >= self.per_source
            if refused_source:
                self.refused["source"] += 1
            elif self._open < self.total:
                return self._take(listener, source)
        if refused_source:
            self.on_refused("source")
            return "source"
        for make_room in self._make_room:  # outside the lock: a listener takes its own
            closed = make_room()
            if closed is not None:
                closed.release()
                with self._lock:
                    self.evicted += 1
                    if self._open < self.total:
                        return self._take(listener, source)
        with self._lock:
            self.refused["full"] += 1
        self.on_refused("full")
        return "full"

    def _take(self, listener: str, source: str) -> Ticket:
        self._open += 1
        self._by_source[source] += 1
        self._by_listener[listener] += 1
        return Ticket(self, listener, source)

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if not ticket.open:
                return
            ticket.open = False
            self._open -= 1
            for counts, key in ((self._by_source, ticket.source),
                                (self._by_listener, ticket.listener)):
                counts[key] -= 1
                if counts[key] <= 0:
                    del counts[key]

    def open(self, listener: str | None = None, source: str | None = None) -> int:
        """Connections open now: in all, on one listener, or from one address."""
        with self._lock:
            if source is not None:
                return self._by_source[source]
            return self._by_listener[listener] if listener is not None else self._open


class _Inbound(asyncio.Protocol):
    """A caller's connection to the relay: admitted by the gate, then spliced to the server."""

    def __init__(self, relay: AdmittedRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.ticket: Ticket | None = None
        self.source = "?"
        self.upstream_port = 0
        self.calls = 0  # calls in flight on it, as the server behind says (begin/end)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if peer else "?"
        admitted = self.relay.gate.admit(self.relay.listener, self.source)
        if isinstance(admitted, str):
            transport.abort()  # at accept: the client sees its connection fail and retries
            return
        self.ticket = admitted
        transport.pause_reading()  # nothing is read until the server's side is open
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(lambda: _Outbound(self),
                                                       "127.0.0.1", self.relay.upstream_port)
        except OSError as exc:
            log.warning("relay %s: the server behind it refused: %s", self.relay.listener, exc)
            if self.transport is not None:
                self.transport.abort()
            return
        assert isinstance(upstream, asyncio.Transport)
        if self.transport is None or self.transport.is_closing():
            upstream.close()
            return
        self.upstream = upstream
        self.upstream_port = int(upstream.get_extra_info("sockname")[1])
        self.relay._opened(self)
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)

    def pause_writing(self) -> None:  # the caller reads slower than the server writes
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay._closed(self)
        if self.ticket is not None:
            self.ticket.release()
        if self.upstream is not None:
            self.upstream.close()
        self.transport = None


class _Outbound(asyncio.Protocol):
    """The relay's connection to the server behind it, for one caller."""

    def __init__(self, inbound: _Inbound) -> None:
        self.inbound = inbound

    def data_received(self, data: bytes) -> None:
        if self.inbound.transport is not None:
            self.inbound.transport.write(data)

    def pause_writing(self) -> None:  # the server reads slower than the caller writes
        if self.inbound.transport is not None:
            self.inbound.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.inbound.transport is not None:
            self.inbound.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inbound.transport is not None:
            self.inbound.transport.close()


class AdmittedRelay:
    """The public port of a server that has no accept hook of its own (gRPC core accepts in C):
    each connection is admitted by the gate, then its bytes are passed both ways to the server,
    which listens on loopback only.

    The server tells its callers apart by the relay's port on the loopback connection
    (``source``: the caller's address; None for a connection that did not come through the
    relay) and says when a call starts and ends on it (``begin``/``end``): a relayed connection
    with no call in flight is idle, and on a full server the one idle the longest may be closed
    to make room, as an idle HTTP connection is. Runs on the server's loop; ``make_room`` may
    be called from any thread."""

    def __init__(self, gate: ConnectionGate, listener: str, upstream_port: int) -> None:
        self.gate, self.listener, self.upstream_port = gate, listener, upstream_port
        self._by_port: dict[int, _Inbound] = {}
        self._idle: OrderedDict[_Inbound, None] = OrderedDict()
        self._lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the port bound."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Inbound(self), host, port, reuse_address=True, backlog=1024)
        self.gate.on_full(self.make_room)
        return int(self._server.sockets[0].getsockname()[1])

    def source(self, upstream_port: int) -> str | None:
        """The address of the caller whose relayed connection uses ``upstream_port``."""
        with self._lock:
            inbound = self._by_port.get(upstream_port)
        return inbound.source if inbound is not None else None

    def begin(self, upstream_port: int) -> None:
        """A call started on that connection: not idle while it runs."""
        with self._lock:
            inbound = self._by_port.get(upstream_port)
            if inbound is not None:
                inbound.calls += 1
                self._idle.pop(inbound, None)

    def end(self, upstream_port: int) -> None:
        with self._lock:
            inbound = self._by_port.get(upstream_port)
            if inbound is not None:
                inbound.calls = max(0, inbound.calls - 1)
                if inbound.calls == 0:
                    self._idle[inbound] = None  # idle from now: the newest idle

    def make_room(self) -> Ticket | None:
        """Close the relayed connection idle the longest; its ticket, counted out now."""
        with self._lock:
            if not self._idle or self._loop is None:
                return None
            oldest, _ = self._idle.popitem(last=False)
            self._by_port.pop(oldest.upstream_port, None)
        transport = oldest.transport
        if transport is not None:
            self._loop.call_soon_threadsafe(transport.abort)
        return oldest.ticket

    def _opened(self, inbound: _Inbound) -> None:
        with self._lock:
            self._by_port[inbound.upstream_port] = inbound
            self._idle[inbound] = None

    def _closed(self, inbound: _Inbound) -> None:
        with self._lock:
            self._idle.pop(inbound, None)
            if self._by_port.get(inbound.upstream_port) is inbound:
                del self._by_port[inbound.upstream_port]

    @property
    def sources(self) -> dict[int, str]:
        """The callers of the connections open now, by the relay's loopback port."""
        with self._lock:
            return {port: inbound.source for port, inbound in self._by_port.items()}

    async def close(self) -> None:
        """Stop accepting and drop the connections still open (call once the server behind
        has finished its calls)."""
        if self._server is not None:
            self._server.close()
        with self._lock:
            inbounds = list(self._by_port.values())  # the idle ones are among them
        for inbound in inbounds:
            if inbound.transport is not None:
                inbound.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()


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

"""OTLP/gRPC receiver: the trace, logs and metrics ``Export`` services on port 4317, the
OpenTelemetry default (the Collector's ``otlp`` exporter, the SDKs' default protocol, vLLM's
trace exporter), through the same decode path, store writer and budget as OTLP/HTTP.

Its own thread and asyncio event loop, so a burst of gRPC calls does not queue behind the HTTP
server's loop (nor the reverse); the writer resolves each commit on the caller's loop.

Status codes, per the OTLP specification's retry rules:

* no token or an unknown one: ``UNAUTHENTICATED``; a token without the ingest role:
  ``PERMISSION_DENIED`` (both checked from the call's metadata before its message is handed
  to the service, so a refused caller's message is never decoded);
* malformed protobuf, rows the store cannot take: ``INVALID_ARGUMENT`` (not retried);
* a message over ``max_message_bytes`` (compressed or not): ``RESOURCE_EXHAUSTED`` without
  ``RetryInfo`` (not retried);
* ingest buffers full, store unavailable, shutting down: ``UNAVAILABLE`` with a
  ``google.rpc.RetryInfo`` of one second (retried);
* records left out (bound credential, provenance): ``OK`` with ``partial_success``;
* no message at all: ``INVALID_ARGUMENT``; a message not all there within ``read_timeout_s``:
  ``DEADLINE_EXCEEDED`` (its reservation back).

Nothing of a message is buffered for a caller before it is admitted. The methods are served
as client-streaming on the wire (a unary call is one message on one HTTP/2 stream either
way): the handler runs when the call's metadata arrives, before any message is read, so a
refused caller is answered without its message being asked for (HTTP/2 flow control then
holds the sender to the small initial window: ``lookahead_bytes``, with BDP probing off so
the window does not grow on its own); an admitted caller first reserves ``max_message_bytes``
of the ingest budget (its principal's fair share bounds how many it may have open), then
reads, and the reservation is trued up to what arrived. A stream that declares a large message
and stalls holds only what it reserved, and only until ``read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from aiops.admission import AdmittedRelay, ConnectionGate, PrincipalSlots
from aiops.auth import Authenticator, AuthError, Principal
from aiops.errors import AIOpsError, DecodeError, PayloadTooLarge, StoreError
from collectors.otlp.export import SIGNALS, Charge, ReceiverMetrics, export
from collectors.otlp.writer import BatchWriter, MemoryBudget, Overloaded, Unstorable

__all__ = ["SERVICES", "GrpcOptions", "GrpcReceiver"]

log = logging.getLogger(__name__)

SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService",
            "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
            "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService"}
_SIGNAL_OF = {f"/{service}/Export": signal for signal, service in SERVICES.items()}
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class GrpcOptions:
    host: str
    port: int
    max_message_bytes: int
    tls: tuple[bytes, bytes] | None = None  # (private key, certificate chain), PEM
    # Streams one connection may have open; a connection must finish its handshake within
    # handshake_s, is closed once idle for idle_s, and none lives past max_age_s (plus a grace
    # for its calls), so silent or stalled connections are bounded.
    max_streams: int = 32
    handshake_s: float = 10.0
    idle_s: float = 60.0
    max_age_s: float = 300.0
    # Connections open at once on this port (past it gRPC closes new ones at accept); the
    # HTTP/2 window a stream gets before its message is asked for; the time a message has to
    # arrive once it is.
    max_connections: int = 1024
    lookahead_bytes: int = 16 * 1024
    read_timeout_s: float = 10.0


def _status_details(code: grpc.StatusCode, message: str, retry_s: int | None
                    ) -> tuple[tuple[str, bytes], ...]:
    """The ``grpc-status-details-bin`` trailer: a google.rpc.Status, with RetryInfo when the
    client should retry (OTLP exporters read the delay from it)."""
    if retry_s is None:
        return ()
    status = status_pb2.Status(code=code.value[0], message=message)
    status.details.add().Pack(error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=retry_s)))
    return (("grpc-status-details-bin", status.SerializeToString()),)


def _authorization(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":  # the first of a repeated key decides, as over HTTP
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


def _refusal(authenticator: Authenticator, metadata: Any
             ) -> tuple[Principal | None, grpc.StatusCode | None, str]:
    """The caller, or why it may not export: as the HTTP gate answers 401/403."""
    try:
        principal = authenticator.authenticate(_authorization(metadata))
    except AuthError as exc:
        return None, grpc.StatusCode.UNAUTHENTICATED, f"{exc} (export needs the ingest role)"
    if principal.allows("ingest"):
        return principal, None, ""
    if principal.name == "anonymous":
        return None, grpc.StatusCode.UNAUTHENTICATED, (
            "export needs a token with the ingest role: 'authorization: Bearer <token>' "
            "in the call's metadata")
    return None, grpc.StatusCode.PERMISSION_DENIED, (
        f"{principal.name} ({principal.label}) may not export: it needs the ingest role")


class _Gate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call from its metadata alone: callers without the ingest role never reach
    the service, and their message is never asked for (a client-streaming handler that
    aborts before it reads)."""

    def __init__(self, authenticator: Authenticator, refused: Callable[[str], None]) -> None:
        self.authenticator, self.refused = authenticator, refused

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        if details.method in _SIGNAL_OF:
            _, code, message = _refusal(self.authenticator, details.invocation_metadata)
            if code is None:
                return await continuation(details)
            self.refused("auth")
        else:
            return await continuation(details)  # gRPC answers UNIMPLEMENTED itself

        async def deny(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
            await context.abort(code, message)
            raise AssertionError("unreachable")  # abort raises

        return grpc.stream_unary_rpc_method_handler(deny)


class _NoMessage(AIOpsError):
    """The call ended without a message."""


class _TooSlow(AIOpsError):
    """The message did not arrive within the read deadline."""


class GrpcReceiver:
    """The gRPC server, started on a thread of its own; ``port`` is the one bound."""

    def __init__(self, options: GrpcOptions, writer: BatchWriter, budget: MemoryBudget,
                 authenticator: Authenticator, metrics: ReceiverMetrics,
                 refused: Callable[[str], None] = lambda _: None,
                 slots: PrincipalSlots | None = None,
                 connections: ConnectionGate | None = None) -> None:
        self.options, self.writer, self.budget = options, writer, budget
        self.slots = slots  # a token's calls in flight, shared with the HTTP gate
        # The server's connection gate, shared with HTTP: gRPC then listens on loopback
        # behind a relay that admits each connection (gRPC core accepts in C, with no hook).
        self.connections = connections
        self._relay: AdmittedRelay | None = None
        self.authenticator, self.metrics, self.refused = authenticator, metrics, refused
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    # -- the service ------------------------------------------------------------------------

    async def _read(self, context: grpc.aio.ServicerContext) -> bytes:
        """The call's one message, within the read deadline."""
        try:
            message = await asyncio.wait_for(context.read(), self.options.read_timeout_s)
        except TimeoutError:
            raise _TooSlow(f"the message did not arrive within "
                           f"{self.options.read_timeout_s:g} s") from None
        if message is grpc.aio.EOF:
            raise _NoMessage("the call carried no message: send one Export request")
        return bytes(message)

    async def _export(self, signal: str, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        principal, code, message = _refusal(self.authenticator, context.invocation_metadata())
        if principal is None:
            assert code is not None
            await context.abort(code, message)
        peer = context.peer() or "?"  # ipv4:127.0.0.1:50514, ipv6:[::1]:50514
        host = peer.split(":", 1)[-1].rsplit(":", 1)[0]
        relayed = 0  # the relay's loopback port of this call's connection
        if self._relay is not None:
            port = peer.rsplit(":", 1)[-1]
            relayed = int(port) if port.isdigit() else 0
            source = self._relay.source(relayed)
            if source is None:  # straight to the loopback port, past the connection gate
                self.refused("auth")
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"connect to port {self.port}, not to the receiver "
                                    "behind it")
            host = source or host
            self._relay.begin(relayed)  # its connection is not idle while the call runs
        try:
            return await self._admitted(signal, context, principal, host, started)
        finally:
            if self._relay is not None:
                self._relay.end(relayed)

    async def _admitted(self, signal: str, context: grpc.aio.ServicerContext,
                        principal: Principal | None, host: str, started: float) -> bytes:
        charge = Charge(self.budget, principal.name if principal else "?", host)
        status, retry = grpc.StatusCode.OK, None
        who = principal.name if principal else ""
        if self.slots is not None and not self.slots.take(who):
            self.refused("busy")
            self.metrics.requests.labels(signal, "grpc", "UNAVAILABLE").inc()
            message = (f"{who} has {self.slots.per_principal} calls in flight already "
                       "(server_max_requests_per_token); retry")
            await context.abort(grpc.StatusCode.UNAVAILABLE, message,
                                trailing_metadata=_status_details(
                                    grpc.StatusCode.UNAVAILABLE, message, RETRY_AFTER_S))
        try:
            # Reserve what the message may be before asking for it (the transport then opens
            # the stream's window to the size the message declares), true up once it is here.
            charge.add(self.options.max_message_bytes)
            request = await self._read(context)
            charge.shrink_to(len(request))
            reply = await export(signal, request, "protobuf", principal, self.writer, charge,
                                 self.metrics)
            return bytes(reply.SerializeToString())
        except Overloaded as exc:
            status, retry, message = grpc.StatusCode.UNAVAILABLE, RETRY_AFTER_S, str(exc)
        except _NoMessage as exc:
            status, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except _TooSlow as exc:
            status, message = grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)
        except (DecodeError, Unstorable) as exc:
            status, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except PayloadTooLarge as exc:
            status, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except StoreError as exc:
            log.error("OTLP/gRPC %s commit failed: %s", signal, exc)
            status, retry = grpc.StatusCode.UNAVAILABLE, RETRY_AFTER_S
            message = f"store unavailable: {exc}"
        finally:
            charge.release()
            if self.slots is not None:
                self.slots.give(who)
            self.metrics.requests.labels(signal, "grpc", status.name).inc()
            self.metrics.seconds.labels(signal, "grpc").observe(time.perf_counter() - started)
        await context.abort(status, message,
                            trailing_metadata=_status_details(status, message, retry))
        raise AssertionError("unreachable")  # abort raises

    def _handlers(self) -> list[grpc.GenericRpcHandler]:
        def handler(signal: str) -> grpc.RpcMethodHandler:
            async def call(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
                return await self._export(signal, context)

            # No (de)serializers: the message's bytes go to aiops' own decoder as they came.
            # Client-streaming: the handler runs before the message is read (see above).
            return grpc.stream_unary_rpc_method_handler(call)

        return [grpc.method_handlers_generic_handler(SERVICES[s], {"Export": handler(s)})
                for s in SIGNALS]

    # -- the server's life ------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> int:
        """Bind and serve; the port bound. Raises AIOpsError when it cannot bind."""
        self._thread = threading.Thread(target=self._run, name="otlp-grpc", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise AIOpsError(f"the OTLP/gRPC receiver did not start within {timeout_s:g} s")
        if self._error is not None:
            raise AIOpsError(f"the OTLP/gRPC receiver cannot listen on "
                             f"{self.options.host}:{self.options.port}: {self._error}")
        return self.port

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
        finally:
            self._started.set()
            loop.close()

    async def _serve(self) -> None:
        o = self.options
        ms = 1000
        server = grpc.aio.server(interceptors=[_Gate(self.authenticator, self.refused)],
                                 options=[
            ("grpc.max_receive_message_length", o.max_message_bytes),
            ("grpc.max_send_message_length", 1 << 20),
            ("grpc.max_concurrent_streams", o.max_streams),
            ("grpc.server_handshake_timeout_ms", int(o.handshake_s * ms)),
            ("grpc.max_connection_idle_ms", int(o.idle_s * ms)),
            ("grpc.max_connection_age_ms", int(o.max_age_s * ms)),
            ("grpc.max_connection_age_grace_ms", 30 * ms),
            ("grpc.max_allowed_incoming_connections", o.max_connections),
            ("grpc.http2.lookahead_bytes", o.lookahead_bytes),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.so_reuseport", 0),  # a second server on the port is an error, not a share
        ])
        server.add_generic_rpc_handlers(self._handlers())
        address = f"[{o.host}]:{o.port}" if ":" in o.host else f"{o.host}:{o.port}"
        if self.connections is not None:
            address = "127.0.0.1:0"  # behind the relay, which takes the public port
        if o.tls is not None:  # TLS ends at gRPC: the relay passes the bytes as they are
            self.port = server.add_secure_port(address, grpc.ssl_server_credentials([o.tls]))
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        if self.connections is not None:
            self._relay = AdmittedRelay(self.connections, "grpc", self.port)
            try:
                self.port = await self._relay.start(o.host, o.port)
            except OSError:
                await server.stop(grace=None)
                raise
        self._stop = asyncio.Event()
        log.info("OTLP/gRPC receiver on %s:%d%s", o.host, self.port,
                 " (TLS)" if o.tls else "")
        self._started.set()
        await self._stop.wait()
        await server.stop(grace=5)
        if self._relay is not None:
            await self._relay.close()

    def close(self) -> None:
        """Stop taking calls; the ones in flight get five seconds to finish."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=15)

"""The gate in front of every route: nothing of a request's body is read before its caller is
known, and no body is read past its route's cap or deadline.

An ASGI middleware, outermost in the app, so it runs before FastAPI parses anything:

1. **Host**: the ``Host`` header must name this server (``allowed_hosts``); a DNS-rebinding
   page that points its own name at 127.0.0.1 gets 400 before anything else.
2. **Caller**: the route's declared access (``aiops.server.guard``) is checked against the
   ``Authorization`` header: 401/403 with ``Connection: close`` and not one byte of the body
   read. The principal is left on the request's state for the route's own guard.
3. **Body**: a declared ``Content-Length`` over the route's cap gets 413 at once; a body that
   streams past the cap, or does not arrive within ``deadline_s``, gets 413 or 408 the moment
   it does (whatever the route was doing with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiops.admission import PrincipalSlots
from aiops.auth import Access, Authenticator, AuthError, Principal, is_loopback

__all__ = ["BodyLimits", "Gate", "allowed_hosts", "host_allowed"]

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class BodyLimits:
    """Largest body per route (by its path template): ``by_path`` first, then ingest's, then
    ``default``."""

    ingest: int
    default: int = 64 * 1024
    by_path: tuple[tuple[str, int], ...] = ()

    def of(self, path: str, access: Access | None) -> int:
        for p, cap in self.by_path:
            if p == path:
                return cap
        return self.ingest if access == "ingest" else self.default


def allowed_hosts(spec: str, bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names the server answers to. ``spec``: comma-separated names, ``*`` for any;
    empty: the loopback names (and this machine's) while bound to loopback, any otherwise
    (beyond loopback every request needs a token, so a rebinding page has nothing to send)."""
    names = {h.strip().lower().strip("[]") for h in spec.split(",") if h.strip()}
    if not names:
        if not is_loopback(bind_host):
            return frozenset({"*"})
        names = {*_LOOPBACK_NAMES, bind_host.lower().strip("[]"), *extra}
    return frozenset(names)


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    if "*" in allowed:
        return True
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:4318
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in allowed


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


class Gate:
    """ASGI middleware; ``access_of(scope)`` says what the matched route needs and its path
    template (None: no route matches, which the app answers itself without reading a body)."""

    def __init__(self, app: ASGIApp, *, authenticator: Authenticator,
                 access_of: Callable[[Scope], tuple[Access | None, str]], limits: BodyLimits,
                 hosts: frozenset[str], deadline_s: float,
                 on_refused: Callable[[str], None] | None = None,
                 slots: PrincipalSlots | None = None) -> None:
        self.app, self.authenticator, self.access_of = app, authenticator, access_of
        self.limits, self.hosts, self.deadline_s = limits, hosts, deadline_s
        self.on_refused = on_refused or (lambda _: None)
        self.slots = slots  # requests in flight per token, shared with the gRPC receiver

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if not host_allowed(headers.get("host"), self.hosts):
            self.on_refused("host")
            await _refuse(send, 400, f"Host {headers.get('host', '')[:100]!r} is not a name "
                          "this server answers to (AIOPS_SERVER_ALLOWED_HOSTS)")
            return
        access, route = self.access_of(scope)
        cap = self.limits.of(route, access)
        if access is not None:
            refused = self._check(access, headers.get("authorization"))
            if isinstance(refused, tuple):
                self.on_refused("auth")
                await _drain(receive, headers, cap)
                await _refuse(send, *refused)
                return
            scope.setdefault("state", {})["principal"] = refused
        declared = headers.get("content-length", "")
        if declared and (not declared.isdigit() or len(declared) > 15 or int(declared) > cap):
            self.on_refused("size")
            code = 413 if declared.isdigit() else 400
            await _refuse(send, code, f"body of {declared[:20]} bytes exceeds this route's "
                          f"limit of {cap} bytes" if code == 413 else "bad Content-Length")
            return
        who = getattr(scope.get("state", {}).get("principal"), "name", "")
        if self.slots is not None and not self.slots.take(who):
            self.on_refused("busy")
            await _drain(receive, headers, cap)
            await _refuse(send, 503, f"{who} has {self.slots.per_principal} requests in flight "
                          "already (server_max_requests_per_token); retry", {"retry-after": "1"})
            return
        try:
            await self._bounded(scope, receive, send, cap)
        finally:
            if self.slots is not None:
                self.slots.give(who)

    def _check(self, access: Access, header: str | None
               ) -> Principal | tuple[int, str, dict[str, str]]:
        challenge = {"www-authenticate": 'Bearer realm="aiops"'}
        try:
            principal = self.authenticator.authenticate(header)
        except AuthError as exc:
            return 401, f"{exc} (this endpoint needs the {access} role)", challenge
        if access in ("public", "slack") or principal.allows(access):
            return principal
        if principal.name == "anonymous":
            return (401, f"this endpoint needs a token with the {access} role: "
                    "'Authorization: Bearer <token>'", challenge)
        return 403, (f"{principal.name} ({principal.label}) may not do this: it needs the "
                     f"{access} role"), {}

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        received, failed, complete = 0, "", False
        started, response_started = time.monotonic(), False

        async def bounded_receive() -> Message:
            nonlocal received, failed, complete
            if complete:  # the body is in; what follows (a disconnect) has no deadline
                return await receive()
            left = self.deadline_s - (time.monotonic() - started)
            try:
                async with asyncio.timeout(max(left, 0.001)):
                    message = await receive()
            except TimeoutError:
                failed = "slow"
                raise _TooSlow from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    failed = "large"
                    raise _TooLarge
                complete = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if failed:  # whatever the app makes of a cut body, the answer is ours
                return
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_TooLarge, _TooSlow):  # the app let it through: below
            await self.app(scope, bounded_receive, guarded_send)
        if failed and not response_started:
            self.on_refused("size" if failed == "large" else "slow")
            if failed == "large":
                await _refuse(send, 413, f"body exceeds this route's limit of {cap} bytes")
            else:
                await _refuse(send, 408, f"request body not received within "
                              f"{self.deadline_s:g} s")


# A refused request's body is read and dropped, up to this much and this long, so that its
# client reads the answer instead of a reset (nginx's lingering close): an exporter with a
# wrong token then sees a final 401, not a network error it retries. Bigger or slower bodies
# are not waited for.
DRAIN_MAX_BYTES = 16 * 2**20
DRAIN_MAX_S = 2.0


async def _drain(receive: Receive, headers: dict[str, str], cap: int) -> None:
    if "100-continue" in headers.get("expect", "").lower():
        return  # the client waits for the answer before it sends the body
    declared = headers.get("content-length", "")
    if declared.isdigit() and len(declared) < 12:
        budget = int(declared) if int(declared) <= min(cap, DRAIN_MAX_BYTES) else 0
    else:
        budget = 64 * 1024 if "chunked" in headers.get("transfer-encoding", "").lower() else 0
    got = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_MAX_S):
            while got < budget:
                message = await receive()
                if message["type"] != "http.request":
                    return
                got += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in scope.get("headers", []):
        name = k.decode("latin-1").lower()
        if name not in out:  # the first of a repeated header decides
            out[name] = v.decode("latin-1")
    return out


async def _refuse(send: Send, code: int, message: str,
                  extra: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        # The body (if any) is left unread: this connection cannot carry another request.
        (b"connection", b"close")]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def route_access_of(app: Any) -> Callable[[Scope], tuple[Access | None, str]]:
    """``access_of`` for a FastAPI app: the access the first fully matching route declared,
    and that route's path template ("" when none matches)."""
    from fastapi.routing import iter_route_contexts

    from aiops.server.guard import route_access

    routes: list[tuple[Any, Access | None]] = []

    def access_of(scope: Scope) -> tuple[Access | None, str]:
        if not routes:  # the app's routes, routers' included (with their guards), once
            routes.extend((ctx, route_access(ctx))
                          for ctx in iter_route_contexts(app.router.routes))
        partial: tuple[Access | None, str] = (None, "")
        for route, access in routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return access, str(route.path)
            if match is Match.PARTIAL and partial[1] == "":
                partial = access, str(route.path)  # other method: the app answers 405
        return partial

    return access_of

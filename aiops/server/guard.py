"""Route guards: every route of the server declares what it needs (``Access``), and a test
enumerates the app's routes and fails on any without a guard.

``Guards(authenticator)(access)`` is a FastAPI dependency: it authenticates the request's
bearer token (401 when missing, malformed or unknown), checks the principal may have
``access`` (403 otherwise) and leaves the principal on ``request.state.principal``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.params import Depends as DependsParam
from fastapi.routing import iter_route_contexts

from aiops.auth import Access, Authenticator, AuthError, Principal

__all__ = ["Guard", "Guards", "declared_routes", "route_access"]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="aiops"'}


@dataclass(frozen=True)
class Guard:
    """The dependency of one route: what it needs, checked against the request's token."""

    authenticator: Authenticator
    access: Access

    async def __call__(self, request: Request) -> Principal:
        # The gate (aiops.server.gate) checked the caller before the body was read; this
        # check stays for an app run without it and costs one comparison.
        try:
            principal = getattr(request.state, "principal", None) or \
                self.authenticator.authenticate(request.headers.get("authorization"))
        except AuthError as exc:
            raise HTTPException(401, f"{exc} (this endpoint needs the {self.access} role)",
                                headers=_CHALLENGE) from exc
        request.state.principal = principal
        if self.access in ("public", "slack"):  # a Slack route checks its signature itself
            return principal
        if not principal.allows(self.access):
            if principal.name == "anonymous":
                raise HTTPException(401, f"this endpoint needs a token with the {self.access} "
                                    "role: 'Authorization: Bearer <token>'", headers=_CHALLENGE)
            raise HTTPException(403, f"{principal.name} ({principal.label}) may not do this: "
                                f"it needs the {self.access} role")
        return principal


class Guards:
    """Makes the ``Depends`` of each access level around one authenticator."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    def __call__(self, access: Access) -> DependsParam:
        dependency: DependsParam = Depends(Guard(self.authenticator, access))
        return dependency


def route_access(route: object) -> Access | None:
    """What a route declared, or None when it has no guard."""
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return None
    for dep in dependant.dependencies:
        if isinstance(dep.call, Guard):
            return dep.call.access
    return None


def declared_routes(app: FastAPI) -> list[tuple[str, str, Access | None]]:
    """(path, kind of route, declared access) of every route the app serves, routers
    included (with their own dependencies merged, as FastAPI resolves them)."""
    out = []
    for ctx in iter_route_contexts(app.routes):
        out.append((str(getattr(ctx, "path", "?")), type(ctx.route).__name__,
                    route_access(ctx)))
    return out

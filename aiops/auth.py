"""Who may do what: roles, scoped bearer tokens and the stack's own credentials.

Roles are ordered (each includes the one before it):

    viewer    read: SQL, incidents, actions, ledger checks, metrics, dashboards
    operator  ask the chat-ops agent and propose actions (the policy still decides)
    admin     approve or deny actions, start rollouts, lifecycle (the control plane)

``ingest`` is not a role but a scope beside them: it may only export OTLP telemetry, and only
an ingest token marked ``provenance`` (the serving stack's own, ``serve``) may write the
hash-chained provenance records. A token has one role or the ingest scope.

Tokens live hashed (sha256) in ``<data_dir>/tokens.json``, made with ``aiops token add``; the
admin token (``AIOPS_ADMIN_TOKEN`` or ``<data_dir>/admin.token``) is the bootstrap admin. The
stack's own ingest credentials are files under ``<data_dir>/credentials/`` (mode 0600).
While the server binds only loopback, a request without a token may be a viewer and export
telemetry (``anonymous_on_loopback``); beyond loopback nothing is anonymous.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import ipaddress
import json
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from aiops.errors import AIOpsError
from aiops.fileperms import private_dir

__all__ = [
    "ADMIN_TOKEN_FILE",
    "ANONYMOUS",
    "Access",
    "AuthError",
    "Authenticator",
    "Principal",
    "Role",
    "TokenStore",
    "ensure_credential",
    "ensure_secret",
    "is_loopback",
    "parse_bearer",
    "stack_credential",
]

ADMIN_TOKEN_FILE = "admin.token"
TOKENS_FILE = "tokens.json"
CREDENTIALS_DIR = "credentials"
# The stack's own ingest sources; ``serve`` alone may write provenance.
STACK_SOURCES = {"serve": True, "ebpf": False}
# The service names a stack source may write as (none: any; Serve's are the models').
EBPF_SERVICE = "aiops-ebpf"
STACK_SERVICES: dict[str, tuple[str, ...]] = {"ebpf": (EBPF_SERVICE,)}
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512


class Role(IntEnum):
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @classmethod
    def parse(cls, name: str) -> Role:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown role {name!r}: viewer, operator or admin") from None

    @property
    def label(self) -> str:
        return self.name.lower()


# What a route needs: a role, the ingest scope, a Slack signature, or nothing (health only).
Access = Literal["public", "slack", "ingest", "viewer", "operator", "admin"]


class AuthError(AIOpsError):
    """A credential is missing, malformed or unknown (HTTP 401)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is: a named token's holder, or ``anonymous``."""

    name: str
    role: Role | None = None
    ingest: bool = False
    provenance: bool = False
    # Glob patterns of the ``service.name`` an ingest token may write rows as (empty: any).
    services: tuple[str, ...] = ()

    def may_write_as(self, service: str | None) -> bool:
        # Bound: a row must name a service, and one the binding allows.
        return not self.services or (bool(service) and any(
            fnmatch.fnmatchcase(service or "", p) for p in self.services))

    def allows(self, access: Access) -> bool:
        if access == "public":
            return True
        if access == "ingest":
            return self.ingest
        if access == "slack":  # checked by the Slack signature, not by a token
            return False
        return self.role is not None and self.role >= Role.parse(access)

    @property
    def label(self) -> str:
        return self.role.label if self.role is not None else ("ingest" if self.ingest
                                                             else "none")


ANONYMOUS = Principal("anonymous")


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches only this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header; None when there is no header.

    Anything else (another scheme, non-ASCII, control characters, an empty or oversized
    token) is an ``AuthError``: a malformed credential never falls back to anonymous.
    """
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthError("use 'Authorization: Bearer <token>'")
    token = token.strip()
    if not token:
        raise AuthError("the bearer token is empty")
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthError(f"the bearer token is longer than {MAX_TOKEN_CHARS} characters")
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise AuthError("the bearer token must be printable ASCII without spaces")
    return token


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def ensure_secret(path: Path) -> str:
    """The secret in ``path``, generated first if there is none.

    The file appears complete or not at all (written to a private temporary file, then
    hard-linked into place), so a reader never sees it empty; of two processes racing to
    create it, both end up with the one that landed.
    """
    with contextlib.suppress(OSError):
        existing = path.read_text().strip()
        if len(existing) >= MIN_TOKEN_CHARS:
            return existing
    private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            existing = path.read_text().strip()
            if len(existing) >= MIN_TOKEN_CHARS:
                return existing
            os.replace(tmp, path)  # a short or empty leftover: not a secret, replace it
            return token
    finally:
        tmp.unlink(missing_ok=True)
    return token


def ensure_credential(data_dir: Path, name: str, role: Role | None,
                      provenance: bool = False) -> str:
    """A named token kept in ``<data_dir>/credentials/<name>.token`` (0600) for a component
    that reads it from there (Prometheus, Grafana, a collector), made and registered on first
    use; ``role=None`` makes an ingest token."""
    token = ensure_secret(data_dir / CREDENTIALS_DIR / f"{name}.token")
    TokenStore(data_dir / TOKENS_FILE).put(name, token, role=role, provenance=provenance,
                                           services=STACK_SERVICES.get(name, ()))
    return token


def stack_credential(data_dir: Path, source: str) -> str:
    """The ingest token of one of the stack's own sources (``serve``, ``ebpf``)."""
    if source not in STACK_SOURCES:
        raise ValueError(f"{source!r} is not one of the stack's sources {sorted(STACK_SOURCES)}")
    return ensure_credential(data_dir, source, None, provenance=STACK_SOURCES[source])


class TokenStore:
    """Named tokens, stored as sha256 digests in a JSON file; re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: list[dict[str, Any]] = []

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            try:
                st = self.path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                self._stamp, self._entries = None, []
                return []
            if stamp != self._stamp:
                try:
                    doc = json.loads(self.path.read_text())
                    entries = [e for e in doc.get("tokens", []) if isinstance(e, dict)]
                except (OSError, ValueError, AttributeError) as exc:
                    raise AuthError(f"cannot read the token file {self.path}: {exc}") from exc
                self._stamp, self._entries = stamp, entries
            return list(self._entries)

    def lookup(self, token: str) -> Principal | None:
        digest = _digest(token)
        found = None
        for e in self.entries():  # compare every entry: the time does not tell which matched
            if secrets.compare_digest(str(e.get("sha256", "")), digest):
                found = e
        if found is None:
            return None
        role = Role.parse(found["role"]) if found.get("role") else None
        services = found.get("services")
        return Principal(str(found["name"]), role, ingest=role is None,
                         provenance=role is None and bool(found.get("provenance")),
                         # An odd binding (not a list of names) binds to nothing: fail closed.
                         services=() if services is None else tuple(
                             str(p) for p in services or [""]) if isinstance(services, list)
                         else ("",))

    @contextlib.contextmanager
    def _editing(self) -> Iterator[list[dict[str, Any]]]:
        """The current entries, under an exclusive lock (several processes edit the file:
        the CLI, the Serve driver, the eBPF collector), read afresh. The lock is taken on the
        folder itself, so no lock file is left beside the secrets."""
        private_dir(self.path.parent)  # a fresh data dir is 0700, as the server makes it
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self._lock:
                self._stamp = None
            yield self.entries()
        finally:
            os.close(fd)  # releases the lock

    def add(self, name: str, role: Role | None, provenance: bool = False,
            services: tuple[str, ...] = ()) -> str:
        """Make a new token called ``name``; return it (only its digest is kept).
        ``services``: for an ingest token, the service names it may write as (globs)."""
        token = f"aiops_{secrets.token_urlsafe(32)}"
        with self._editing() as entries:
            if any(e.get("name") == name for e in entries):
                raise ValueError(f"a token called {name!r} exists: revoke it first")
            self._put(entries, name, token, role, provenance, services)
        return token

    def put(self, name: str, token: str, role: Role | None, provenance: bool = False,
            services: tuple[str, ...] = ()) -> None:
        """Register ``token`` as ``name`` (replacing an entry of that name)."""
        with self._editing() as entries:
            self._put(entries, name, token, role, provenance, services)

    def _put(self, entries: list[dict[str, Any]], name: str, token: str, role: Role | None,
             provenance: bool, services: tuple[str, ...] = ()) -> None:
        if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name):
            raise ValueError(f"token name {name!r}: 1-64 letters, digits, '.', '_' or '-'")
        if services and role is not None:
            raise ValueError("only an ingest token is bound to services")
        if any(not p or len(p) > 200 for p in services):
            raise ValueError("a service pattern is 1-200 characters")
        entry: dict[str, Any] = {"name": name, "role": role.label if role else None,
                                 "provenance": bool(provenance), "sha256": _digest(token),
                                 "created": datetime.now(UTC).isoformat(timespec="seconds")}
        if services:
            entry["services"] = list(services)
        current = next((e for e in entries if e.get("name") == name), None)
        if current is not None and current.get("sha256") == entry["sha256"] \
                and current.get("role") == entry["role"] \
                and current.get("provenance") == entry["provenance"] \
                and current.get("services") == entry.get("services"):
            return
        self._write([*(e for e in entries if e.get("name") != name), entry])

    def revoke(self, name: str) -> bool:
        with self._editing() as entries:
            kept = [e for e in entries if e.get("name") != name]
            if len(kept) == len(entries):
                return False
            self._write(kept)
        return True

    def _write(self, entries: list[dict[str, Any]]) -> None:
        private_dir(self.path.parent)  # a fresh data dir is 0700, as the server makes it
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"tokens": entries}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Authenticator:
    """Turns an ``Authorization`` header into a ``Principal``.

    ``admin_token`` is a callable so that a token file written after start-up counts; an empty
    or short admin token never authenticates anyone.
    """

    def __init__(self, tokens: TokenStore, admin_token: Any, anonymous: bool) -> None:
        self.tokens = tokens
        self._admin_token = admin_token
        self.anonymous = (Principal("anonymous", Role.VIEWER, ingest=True) if anonymous
                          else ANONYMOUS)

    @classmethod
    def from_settings(cls, settings: Any) -> Authenticator:
        data_dir = Path(settings.data_dir)

        def admin() -> str:
            if settings.admin_token:
                return str(settings.admin_token)
            with contextlib.suppress(OSError):
                return (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
            return ""

        return cls(TokenStore(data_dir / TOKENS_FILE), admin,
                   settings.anonymous_on_loopback and is_loopback(settings.server_host))

    def authenticate(self, header: str | None) -> Principal:
        token = parse_bearer(header)
        if token is None:
            return self.anonymous
        admin = self._admin_token() or ""
        if len(admin) >= MIN_TOKEN_CHARS and secrets.compare_digest(
                admin.encode("ascii", "replace"), token.encode("ascii")):
            return Principal("admin", Role.ADMIN)
        found = self.tokens.lookup(token)
        if found is None:
            raise AuthError("unknown token")
        return found

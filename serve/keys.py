"""Keys that encrypt model weights at rest (AES-256-GCM, see ``serve.packages``).

A package records the *id* of the key it was encrypted with, never the key. Whoever loads it
asks a ``KeyProvider`` for that id:

    class KeyProvider(Protocol):
        def key_for(self, key_id: str) -> bytes: ...   # 32 bytes, or raise KeyUnavailable

Two providers ship: ``FileKeyProvider`` (a key file, ``aiops model-key`` writes one, 0600) and
``EnvKeyProvider`` (``AIOPS_MODEL_KEY``). Both hold one key and give it for any id; the
package's key fingerprint tells a wrong key from a right one. A KMS plugs in as a provider of
its own - ``key_for`` fetches (or unwraps) the data key named ``key_id`` - named by
``AIOPS_MODEL_KEY_PROVIDER=package.module:factory``, a callable that returns the provider.

``key_provider_from_env`` picks, first set first: ``AIOPS_MODEL_KEY_PROVIDER``,
``AIOPS_MODEL_KEY_FILE``, ``AIOPS_MODEL_KEY``; none set: no provider (an encrypted package is
then refused, saying which variables would supply its key). Replicas inherit these variables
from the process that started the stack (``aiops up``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from aiops.errors import AIOpsError

__all__ = [
    "ENV_KEY",
    "ENV_KEY_FILE",
    "ENV_PROVIDER",
    "KEY_BYTES",
    "EnvKeyProvider",
    "FileKeyProvider",
    "KeyProvider",
    "KeyUnavailable",
    "describe",
    "fingerprint",
    "generate_model_key",
    "key_provider_from_env",
    "parse_key",
]

ENV_KEY, ENV_KEY_FILE, ENV_PROVIDER = ("AIOPS_MODEL_KEY", "AIOPS_MODEL_KEY_FILE",
                                       "AIOPS_MODEL_KEY_PROVIDER")
KEY_BYTES = 32  # AES-256
HOW_TO_CONFIGURE = (f"set {ENV_KEY_FILE} (a key file), {ENV_KEY} (base64 or hex) or "
                    f"{ENV_PROVIDER} (module:factory of a KMS provider)")


class KeyUnavailable(AIOpsError):
    """A key provider cannot supply a key (unreadable, malformed, unknown id, KMS down)."""


@runtime_checkable
class KeyProvider(Protocol):
    """Gives the 32-byte AES key named ``key_id``, or raises ``KeyUnavailable``."""

    def key_for(self, key_id: str) -> bytes: ...


def describe(provider: KeyProvider) -> str:
    """How a provider names itself in messages (its ``description``, else its class)."""
    return str(getattr(provider, "description", type(provider).__name__))


def fingerprint(key: bytes) -> str:
    """A short, one-way identifier of a key: tells a wrong key from the right one without
    trying to decrypt, and reveals nothing usable about a 256-bit key."""
    return "sha256:" + hashlib.sha256(b"aiops-model-key\0" + key).hexdigest()[:16]


def parse_key(raw: bytes, source: str) -> bytes:
    """A key as written in a file or a variable: base64 or hex text, or 32 raw bytes."""
    if len(raw) == KEY_BYTES:
        return raw  # raw bytes: a key as text is 44 (base64) or 64 (hex) characters long
    text = raw.strip()
    key: bytes | None = None
    if len(text) == 2 * KEY_BYTES:
        try:
            key = bytes.fromhex(text.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            key = None
    if key is None:
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise KeyUnavailable(f"{source} is not a key: expected {KEY_BYTES} bytes as base64 "
                                 f"or hex text") from None
    if len(key) != KEY_BYTES:
        raise KeyUnavailable(f"{source} holds a {len(key)}-byte key; AES-256 needs "
                             f"{KEY_BYTES} bytes")
    return key


class FileKeyProvider:
    """One key read from a file (base64 or hex text, or raw bytes), for any key id."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.description = f"key file {self.path}"

    def key_for(self, key_id: str) -> bytes:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise KeyUnavailable(f"cannot read key file {self.path}: "
                                 f"{exc.strerror or exc}") from exc
        return parse_key(raw, f"key file {self.path}")


class EnvKeyProvider:
    """One key from an environment variable (base64 or hex), for any key id."""

    def __init__(self, variable: str = ENV_KEY, environ: Mapping[str, str] | None = None
                 ) -> None:
        self.variable = variable
        self.environ = os.environ if environ is None else environ
        self.description = f"${variable}"

    def key_for(self, key_id: str) -> bytes:
        value = self.environ.get(self.variable, "")
        if not value:
            raise KeyUnavailable(f"${self.variable} is not set")
        return parse_key(value.encode(), f"${self.variable}")


def _plugin(target: str) -> KeyProvider:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise KeyUnavailable(f"${ENV_PROVIDER}={target!r}: expected 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise KeyUnavailable(f"${ENV_PROVIDER}={target!r} cannot be loaded: {exc}") from exc
    provider = factory()
    if not isinstance(provider, KeyProvider):
        raise KeyUnavailable(f"${ENV_PROVIDER}={target!r} returned {type(provider).__name__}, "
                             "which has no key_for(key_id)")
    return provider


def key_provider_from_env(environ: Mapping[str, str] | None = None) -> KeyProvider | None:
    """The provider the environment configures (see the module docstring), or None."""
    env = os.environ if environ is None else environ
    if env.get(ENV_PROVIDER):
        return _plugin(env[ENV_PROVIDER])
    if env.get(ENV_KEY_FILE):
        return FileKeyProvider(Path(env[ENV_KEY_FILE]))
    if env.get(ENV_KEY):
        return EnvKeyProvider(ENV_KEY, env)
    return None


def generate_model_key(path: Path) -> Path:
    """A new random AES-256 key, base64 in a file only its owner can read (never overwrites)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n")
    return path

"""API keys for the OpenAI endpoints: ``Authorization: Bearer <key>`` against a configured set
(``AIOPS_API_KEYS``). No keys configured means the endpoints are open (loopback default)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

__all__ = ["authorized"]


def authorized(authorization: str | None, keys: Sequence[str]) -> bool:
    """Whether an ``Authorization`` header value carries one of ``keys`` (constant time)."""
    if not keys:
        return True
    header = authorization or ""
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    # Compare against every key so timing does not reveal which one nearly matched.
    matches = [hmac.compare_digest(token.encode(), k.encode()) for k in keys]
    return bool(token) and any(matches)

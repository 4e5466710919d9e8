"""What the Slack tests share: requests signed as Slack signs them, and a `response_url`
receiver that collects what the server posts back."""

from __future__ import annotations

import hashlib
import hmac
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request

from tests.loopback import serving

__all__ = ["response_receiver", "signed"]


def signed(body: str, secret: str, ts: int | None = None) -> dict[str, str]:
    """Headers of a slash command ``body`` signed with ``secret`` at ``ts`` (default now)."""
    ts = ts or int(time.time())
    mac = hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"x-slack-request-timestamp": str(ts), "x-slack-signature": f"v0={mac}",
            "content-type": "application/x-www-form-urlencoded"}


@contextmanager
def response_receiver() -> Iterator[tuple[str, queue.Queue[dict[str, Any]]]]:
    """A loopback `response_url` and the queue of JSON bodies posted to it."""
    got: queue.Queue[dict[str, Any]] = queue.Queue()
    app = FastAPI()

    @app.post("/hook")
    async def hook(request: Request) -> dict[str, bool]:
        got.put(await request.json())
        return {"ok": True}

    with serving(app) as url:
        yield f"{url}/hook", got

"""A FastAPI app in a real uvicorn on a loopback port, for the duration of a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from aiops.config import Settings
from aiops.server.connections import uvicorn_config
from aiops_harness.bench.common import free_port


@contextmanager
def serving(app: FastAPI, port: int | None = None,
            settings: Settings | None = None) -> Iterator[str]:
    """The app's base URL while it runs (on ``port``, else a free one); with ``settings``,
    as `aiops server` runs it (its connection limits)."""
    port = port or free_port()
    config = uvicorn_config(app, settings.model_copy(update={"server_port": port}),
                            log_level="warning", access_log=False) if settings else \
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                       access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)

"""Free loopback ports for processes aiops starts beside Ray (servers, HAProxy's metrics)."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A free loopback port outside both the kernel's ephemeral range (32768+) and Ray's
    worker ports (10002-19999): a port the kernel hands out for bind(0) can be taken by any
    of Ray's many sockets before our server binds it."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")

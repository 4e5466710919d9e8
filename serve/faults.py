"""Fault injection per model version, for demos and tests.

Faults come from the spec's ``faults`` or, at run time, from the control plane (in place, no
restart). They act on the request path only: telemetry sees slower requests, failed requests,
busy CPUs, a growing heap or a restarted replica, never a "fault" label.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

from aiops.errors import ModelError
from serve.specs import Faults

__all__ = ["FaultInjector"]

log = logging.getLogger(__name__)


class FaultInjector:
    def __init__(self, faults: Faults | None = None, rng: random.Random | None = None) -> None:
        self.faults = faults or Faults()
        self._rng = rng or random.Random()
        self._leak: list[bytearray] = []
        self.requests = 0

    def update(self, faults: Faults) -> None:
        self.faults = faults
        if not faults.memory_growth_mb:
            self._leak.clear()

    async def before_request(self) -> None:
        f = self.faults
        if not f.active:
            return
        self.requests += 1
        if f.crash_after and self.requests >= f.crash_after:
            log.error("replica exiting")
            os._exit(1)  # a crash, as a segfaulting engine would: no cleanup, no goodbye
        if f.latency_ms:
            await asyncio.sleep(f.latency_ms / 1000)
        if f.cpu_burn_ms:
            await asyncio.to_thread(_burn, f.cpu_burn_ms / 1000)
        if f.memory_growth_mb:
            chunk = bytearray(int(f.memory_growth_mb * 2**20))
            chunk[::4096] = b"\x01" * len(chunk[::4096])  # touch the pages so RSS grows
            self._leak.append(chunk)
        if f.error_rate and self._rng.random() < f.error_rate:
            raise ModelError("backend error: internal error (code 13)")

    async def per_token(self) -> None:
        if self.faults.slow_tokens_ms:
            await asyncio.sleep(self.faults.slow_tokens_ms / 1000)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1

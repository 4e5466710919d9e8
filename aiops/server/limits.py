"""Process limits of the server."""

from __future__ import annotations

import logging
import resource

__all__ = ["limit_memory"]

log = logging.getLogger(__name__)


def limit_memory(megabytes: int) -> None:
    """Cap the process's data memory (RLIMIT_DATA) at ``megabytes`` (0: leave it).

    DuckDB's ``memory_limit`` bounds its buffer pool, not every allocation: a query can still
    build huge strings or lists (``repeat``, concatenation). Past this cap such an allocation
    fails inside DuckDB as an out-of-memory error for that query (or a MemoryError for one
    request) and the server carries on, instead of the kernel's OOM killer ending it.
    """
    if megabytes <= 0:
        return
    want = megabytes * 2**20
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and hard < want:
        want = hard
    if soft == resource.RLIM_INFINITY or soft > want:
        resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
        log.info("data memory capped at %d MiB", want // 2**20)

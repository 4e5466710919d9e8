"""Process limits of the server."""

from __future__ import annotations

import logging
import resource

__all__ = ["ensure_descriptors", "limit_memory"]

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


def ensure_descriptors(listener_connections: int, spare: int = 1024) -> int:
    """Make room for every listener's connection cap at once (HTTP and gRPC each count their
    own): raise the soft file-descriptor limit to ``listener_connections + spare`` (never past
    the hard limit), so connections refused by the caps are refused there, not by ``accept``
    failing for every listener (18,022 gRPC connections once took all 20,000 descriptors).
    Returns the soft limit in force; warns when the hard limit is too low."""
    want = listener_connections + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        log.warning("the file-descriptor limit (%d) is below the listeners' connection caps "
                    "plus %d spare (%d): lower server_max_connections or raise `ulimit -n`",
                    hard, spare, want)
        want = hard
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    return soft

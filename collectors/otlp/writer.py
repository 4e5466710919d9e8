"""Group commit and a memory budget for ingest.

Requests decode on their own and hand their Arrow tables to one committer thread, which merges
everything pending into one transaction (bounded in rows, so readers are never held up long)
and then answers every request in it. A request is acknowledged only after its commit, so a
2xx means the rows are in DuckDB (and in its WAL on disk): a SIGKILL loses nothing
acknowledged.

The budget bounds the bytes of request bodies and decoded tables in flight. A request is
charged for the bytes of its body as they arrive (so a client that announces a large body and
sends little holds little), then for its decoding working set once the body is complete; one
that does not fit gets a retryable 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from aiops.errors import AIOpsError, SchemaMismatch, StoreError
from aiops.schema import table
from aiops.store import Store
from aiops.store_conform import mergeable

__all__ = ["CLIENT_SHARE", "PRINCIPAL_SHARE", "SOURCE_SHARE", "BatchWriter", "MemoryBudget",
           "Overloaded", "Unstorable"]

log = logging.getLogger(__name__)


class Overloaded(AIOpsError):
    """Ingest is over its memory budget; retry later."""


class Unstorable(AIOpsError):
    """A request's rows cannot be stored as they are (alone, not for want of the store)."""


# The most of the budget one source address, and one named principal (a token, from however
# many addresses), may hold at once: a stalled or huge upload of one source leaves half to
# everyone else, and two tokens together leave half too. One request alone may exceed them
# (a large body is never refused forever), not two.
SOURCE_SHARE = 0.5
PRINCIPAL_SHARE = 0.25
CLIENT_SHARE = SOURCE_SHARE  # the older name


class MemoryBudget:
    def __init__(self, limit_bytes: int, source_share: float = SOURCE_SHARE,
                 principal_share: float = PRINCIPAL_SHARE) -> None:
        self.limit = limit_bytes
        self.source_limit = int(limit_bytes * source_share)
        self.principal_limit = int(limit_bytes * principal_share)
        self.used = 0
        self.peak = 0
        self._held: dict[str, int] = defaultdict(int)  # "s:<address>", "p:<principal>"
        self._lock = threading.Lock()

    def acquire(self, n: int, held: int = 0, source: str = "", principal: str = "") -> None:
        """Take ``n`` bytes more for a request from ``source`` by ``principal`` (empty: not
        counted apart, as the anonymous principal) that already holds ``held``."""
        with self._lock:
            if self.used > held and self.used + n > self.limit:
                raise Overloaded(f"ingest buffers are full ({self.used >> 20} MiB of "
                                 f"{self.limit >> 20} MiB in use); retry later")
            for key, cap, who in ((f"s:{source}", self.source_limit, "this address"),
                                  (f"p:{principal}", self.principal_limit, "this token")):
                if key.endswith(":"):
                    continue
                mine = self._held[key]
                if mine > held and mine + n > cap:
                    raise Overloaded(f"{who} holds {mine >> 20} MiB of ingest buffers, its "
                                     f"share of {cap >> 20} MiB; retry later")
            self.used += n
            for key in (f"s:{source}", f"p:{principal}"):
                if not key.endswith(":"):
                    self._held[key] += n
            self.peak = max(self.peak, self.used)

    def release(self, n: int, source: str = "", principal: str = "") -> None:
        with self._lock:
            self.used -= n
            for key in (f"s:{source}", f"p:{principal}"):
                if key.endswith(":"):
                    continue
                left = self._held[key] - n
                if left > 0:
                    self._held[key] = left
                else:
                    self._held.pop(key, None)


@dataclass
class _Pending:
    tables: dict[str, pa.Table]
    chained: dict[str, list[dict[str, Any]]]
    done: asyncio.Future[int]
    loop: asyncio.AbstractEventLoop
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = sum(t.num_rows for t in self.tables.values()) + sum(
            len(v) for v in self.chained.values())


class BatchWriter:
    def __init__(self, store: Store, max_batch_rows: int = 200_000,
                 max_delay_s: float = 0.005) -> None:
        self.store = store
        self.max_batch_rows = max_batch_rows
        self.max_delay_s = max_delay_s
        self.commits = 0
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="otlp-committer", daemon=True)
        self._thread.start()

    async def submit(self, tables: dict[str, pa.Table],
                     chained: dict[str, list[dict[str, Any]]] | None = None) -> int:
        """Queue rows for the next group commit; return once they are committed."""
        loop = asyncio.get_running_loop()
        item = _Pending(tables, chained or {}, loop.create_future(), loop)
        if not item.rows:
            return 0
        with self._cond:
            if self._stopping:
                raise Overloaded("the server is shutting down")
            self._queue.append(item)
            self._cond.notify()
        return await item.done

    def _take(self) -> list[_Pending]:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return []
            # Let concurrent requests join this commit, briefly.
            if self.max_delay_s and sum(p.rows for p in self._queue) < self.max_batch_rows:
                self._cond.wait(self.max_delay_s)
            batch: list[_Pending] = []
            rows = 0
            while self._queue and (not batch or rows + self._queue[0].rows
                                   <= self.max_batch_rows):
                item = self._queue.pop(0)
                batch.append(item)
                rows += item.rows
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            error = self._commit(batch)
            if error is not None and len(batch) > 1:
                # One request's rows must not fail the others': each alone, then.
                log.warning("group commit of %d requests failed (%s); committing each "
                            "alone", len(batch), error)
                for p in batch:
                    p.loop.call_soon_threadsafe(_resolve, p.done, p.rows, self._commit([p]))
                continue
            for p in batch:
                p.loop.call_soon_threadsafe(_resolve, p.done, p.rows, error)

    def _commit(self, batch: list[_Pending]) -> BaseException | None:
        tables: dict[str, list[pa.Table]] = defaultdict(list)
        chained: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for p in batch:
            for name, t in p.tables.items():
                if t.num_rows:
                    tables[name].append(t)
            for name, entries in p.chained.items():
                chained[name].extend(entries)
        try:
            # Requests whose decoder derived the spans columns and those that left it to the
            # store (mergeable) do not concatenate as they are: then the store derives all.
            self.store.append_many(
                {n: pa.concat_tables(mergeable(table(n), ts)) for n, ts in tables.items()},
                dict(chained))
        except SchemaMismatch as exc:
            return Unstorable(f"rows do not fit their table: {exc}")
        except StoreError as exc:  # the store's (disk, engine): retryable
            log.error("commit of %d requests failed: %s", len(batch), exc)
            return exc
        except Exception as exc:  # noqa: BLE001 - every waiter must get an answer
            # Rows that cannot be converted or linked as they are: the request's, not ours.
            log.warning("commit of %d requests refused their rows: %s", len(batch), exc)
            return Unstorable(f"rows cannot be stored: {exc}")
        self.commits += 1
        return None

    def close(self) -> None:
        """Commit what is queued, then stop."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=60)


def _resolve(fut: asyncio.Future[int], rows: int, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(rows)

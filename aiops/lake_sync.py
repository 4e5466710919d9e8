"""The schedule of a server's lake: commit its new rows every few seconds, tidy the lake every
hour; say clearly when the lake cannot be reached and when it can again. Rows wait in the
local store meanwhile (``aiops.lake``), so an outage delays the lake, it loses nothing."""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from aiops.errors import StoreError
from aiops.periodic import Health, Periodic, PeriodicMetrics
from aiops.store import Store

__all__ = ["LakeSync"]

log = logging.getLogger(__name__)

REMIND_S = 60.0  # while the lake is unreachable, a line this often


class LakeSync:
    def __init__(self, store: Store, commit_interval_s: float, upkeep_interval_s: float,
                 registry: CollectorRegistry | None = None,
                 metrics: PeriodicMetrics | None = None) -> None:
        if store.lake is None:
            raise StoreError("the store has no lake attached")
        self.store = store
        self.commit_interval_s = commit_interval_s
        self.upkeep_interval_s = upkeep_interval_s
        # A failed commit is this module's to report (StoreError: the lake is down, rows wait);
        # anything else a step raises goes to the worker's policy (logged, counted, backed off).
        self._worker = Periodic("lake-sync", commit_interval_s, self._step, metrics=metrics)
        self._last_upkeep = time.monotonic()
        self._down_since: float | None = None
        self._reminded = 0.0
        self._commits = Counter("aiops_lake_commits", "Commits of this server's rows to the "
                                "lake, by outcome (ok, failed)", ["outcome"], registry=registry)
        self._rows = Counter("aiops_lake_rows_committed", "Rows this server committed to the "
                             "lake", registry=registry)
        self._seconds = Histogram("aiops_lake_commit_seconds", "Time of one lake commit",
                                  registry=registry)
        self._waiting = Gauge("aiops_lake_rows_waiting", "Rows stored here that the lake does "
                              "not hold yet", registry=registry)
        self._upkeep = Histogram("aiops_lake_upkeep_seconds", "Time of one lake upkeep (file "
                                 "merges, snapshot expiry)", registry=registry)

    def commit_once(self) -> int:
        """One commit; returns the rows it moved (0 where it failed: logged and counted)."""
        started = time.monotonic()
        try:
            result = self.store.commit_lake()
        except StoreError as exc:
            self._commits.labels("failed").inc()
            self._failed(exc)
            return 0
        finally:
            self._seconds.observe(time.monotonic() - started)
        self._commits.labels("ok").inc()
        self._rows.inc(result.rows)
        if self._down_since is not None:
            log.warning("the lake is reachable again after %.0f s: committed %d waiting rows "
                        "(batches up to %d)", time.monotonic() - self._down_since,
                        result.rows, result.upto)
            self._down_since = None
        self._waiting.set(0)
        return result.rows

    def _failed(self, exc: StoreError) -> None:
        now = time.monotonic()
        try:
            waiting = self.store.lake_waiting()
        except StoreError:
            waiting = -1
        self._waiting.set(max(waiting, 0))
        if self._down_since is None or now - self._reminded >= REMIND_S:
            since = "" if self._down_since is None else \
                f" (down for {now - self._down_since:.0f} s)"
            log.error("lake unreachable%s: %s; %d rows wait in the local store and are "
                      "committed when it is back (retrying every %g s)", since, exc, waiting,
                      self.commit_interval_s)
            self._reminded = now
        if self._down_since is None:
            self._down_since = now

    def upkeep_once(self) -> bool:
        started = time.monotonic()
        try:
            self.store.lake_upkeep()
        except StoreError as exc:  # another server's upkeep or a commit won: the next one
            log.warning("%s", exc)
            return False
        finally:
            self._upkeep.observe(time.monotonic() - started)
        return True

    def _step(self) -> None:
        self.commit_once()
        if self.upkeep_interval_s and \
                time.monotonic() - self._last_upkeep >= self.upkeep_interval_s:
            self.upkeep_once()
            self._last_upkeep = time.monotonic()

    def start(self) -> None:
        self._last_upkeep = time.monotonic()
        self._worker.start()

    def close(self) -> None:
        """Stop the schedule and commit what is left (a failure leaves it in the local
        store, for the next start)."""
        self._worker.close(timeout_s=60)
        self.commit_once()

    def health(self) -> Health:
        return self._worker.health()

"""Time-based retention: every interval, rows older than the retention window move from DuckDB
to Parquet files in the archive, where the ``<table>_all`` views still find them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiops.errors import StoreError
from aiops.periodic import Health, Periodic, PeriodicMetrics
from aiops.store import TIME_SERIES_TABLES, Store

__all__ = ["Retention"]

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, store: Store, hours: float, interval_s: float,
                 clock: Callable[[], int] = time.time_ns,
                 metrics: PeriodicMetrics | None = None) -> None:
        self.store = store
        self.window_ns = int(hours * 3600 * 1e9)
        self.interval_s = interval_s
        self._now = clock
        self._worker = Periodic("retention", interval_s, self.run_once, metrics=metrics)

    def run_once(self) -> dict[str, int]:
        cutoff = self._now() - self.window_ns
        moved = {}
        for name in TIME_SERIES_TABLES:
            try:
                moved[name] = self.store.archive(name, cutoff)
            except StoreError as exc:  # log, carry on: the next run retries
                log.error("retention of %s failed: %s", name, exc)
        return moved

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        self._worker.close(timeout_s=30)

    def health(self) -> Health:
        return self._worker.health()

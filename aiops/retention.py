"""Time-based retention: every interval, rows older than the retention window move from DuckDB
to Parquet files in the archive, where the ``<table>_all`` views still find them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from aiops.errors import StoreError
from aiops.store import TIME_SERIES_TABLES, Store

__all__ = ["Retention"]

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, store: Store, hours: float, interval_s: float,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.store = store
        self.window_ns = int(hours * 3600 * 1e9)
        self.interval_s = interval_s
        self._now = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.run_once()

        self._thread = threading.Thread(target=loop, name="retention", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

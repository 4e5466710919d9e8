"""One lifecycle for the server's background components, and one periodic worker.

Every background loop of the server (scraping, attached-serving reads, the analyzer's rounds,
retention, the lake's commits) is a :class:`Periodic`: one thread that runs its step every
``interval_s`` with one failure policy. A step that raises is **logged** (the traceback for the
first failure of a streak, then one line a minute while it lasts, and a line when it works
again), **counted** (``aiops_component_runs_total{component, outcome}`` and the
``aiops_component_failing`` streak), **backed off** (the wait doubles with each failure in a
row, up to ``max_backoff`` times the interval) and **surfaced** (:meth:`Periodic.health`, which
the server's ``/readyz`` lists). No exception ends the loop; only :meth:`Periodic.close` does.

:class:`Components` is the server's list of them (and of anything else with ``start`` and
``close``): started in order, closed in reverse, so that what depends on another component
starts after it and stops before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["Component", "Components", "Health", "Periodic", "PeriodicMetrics"]

log = logging.getLogger(__name__)

REMIND_S = 60.0  # while a step keeps failing, one log line this often


class Component(Protocol):
    def start(self) -> object: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Health:
    """A periodic component's state: its runs, failures, and the current streak of failures
    (0: its last run worked) with the latest error."""

    name: str
    runs: int
    failures: int
    streak: int
    last_error: str | None

    @property
    def failing(self) -> bool:
        return self.streak > 0


class PeriodicMetrics:
    """The metric families every periodic component of one registry shares."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.runs = Counter("aiops_component_runs", "Runs of a background component's step, "
                            "by outcome (ok, failed)", ["component", "outcome"],
                            registry=registry)
        self.failing = Gauge("aiops_component_failing", "Failures in a row of a background "
                             "component's step (0: its last run worked)", ["component"],
                             registry=registry)


class Periodic:
    """Run ``step`` every ``interval_s`` seconds on a thread named ``name``, first after one
    interval (``run_first``: at once). On a failure the next wait is ``interval_s * 2**streak``,
    at most ``max_backoff`` times the interval."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], object], *,
                 run_first: bool = False, max_backoff: float = 8.0,
                 metrics: PeriodicMetrics | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"{name}: interval_s must be positive, got {interval_s}")
        self.name, self.interval_s, self.step = name, interval_s, step
        self.run_first, self.max_backoff = run_first, max(1.0, max_backoff)
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._runs = self._failures = self._streak = 0
        self._last_error: str | None = None
        self._reminded = 0.0

    # -- the loop ------------------------------------------------------------------------------

    def run_once(self) -> bool:
        """One step under the failure policy; True when it worked."""
        try:
            self.step()
        except Exception as exc:  # noqa: BLE001 - the policy: log, count, back off; never end
            self._failed(exc)
            return False
        self._worked()
        return True

    def _worked(self) -> None:
        with self._lock:
            streak, self._streak = self._streak, 0
            self._runs += 1
        if streak:
            log.warning("%s works again after %d failed runs", self.name, streak)
        if self._metrics is not None:
            self._metrics.runs.labels(self.name, "ok").inc()
            self._metrics.failing.labels(self.name).set(0)

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._runs += 1
            self._failures += 1
            self._streak += 1
            streak = self._streak
            self._last_error = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if streak == 1:
            log.exception("%s failed (retrying in %g s)", self.name, self.wait_s())
            self._reminded = now
        elif now - self._reminded >= REMIND_S:
            log.error("%s still failing (%d runs in a row): %s", self.name, streak,
                      self._last_error)
            self._reminded = now
        if self._metrics is not None:
            self._metrics.runs.labels(self.name, "failed").inc()
            self._metrics.failing.labels(self.name).set(streak)

    def wait_s(self) -> float:
        """The wait before the next run: the interval, doubled per failure in a row."""
        with self._lock:
            streak = self._streak
        return self.interval_s * min(2.0 ** streak, self.max_backoff)

    def _loop(self) -> None:
        if self.run_first:
            self.run_once()
        while not self._stop.wait(self.wait_s()):
            self.run_once()

    # -- the lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} is already started")
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the loop (a step in progress finishes first, up to ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.error("%s did not stop within %g s", self.name, timeout_s)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def health(self) -> Health:
        with self._lock:
            return Health(self.name, self._runs, self._failures, self._streak,
                          self._last_error)


class Components:
    """Background components in start order; closed in reverse."""

    def __init__(self) -> None:
        self._items: list[tuple[str, Component]] = []
        self._started: list[tuple[str, Component]] = []

    def add(self, name: str, component: Component) -> None:
        self._items.append((name, component))

    def on_close(self, name: str, close: Callable[[], object]) -> None:
        """Something that only needs closing (a pool, a queue to flush), in its place."""
        self.add(name, _Closing(close))

    def start(self) -> None:
        """Start each in order; when one fails, close those already started and re-raise."""
        for name, component in self._items:
            try:
                component.start()
            except BaseException:
                log.error("%s failed to start; closing the components started before it", name)
                self.close()
                raise
            self._started.append((name, component))

    def close(self) -> None:
        """Close the started components in reverse order; one that fails to close is logged
        and the others still close."""
        while self._started:
            name, component = self._started.pop()
            try:
                component.close()
            except Exception:
                log.exception("%s failed to close", name)

    def names(self) -> list[str]:
        return [name for name, _ in self._items]

    def health(self) -> list[Health]:
        """The periodic components' health, in start order (each one with ``health()``)."""
        return list(_healths(c for _, c in self._items))


def _healths(components: Iterable[Component]) -> Iterable[Health]:
    for c in components:
        health = getattr(c, "health", None)
        if callable(health):
            got = health()
            if isinstance(got, Health):
                yield got


class _Closing:
    def __init__(self, close: Callable[[], object]) -> None:
        self._close = close

    def start(self) -> None:
        return None

    def close(self) -> None:
        self._close()

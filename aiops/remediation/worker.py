"""Remediation off the detection thread.

The incident tracker tells its listeners of every analytics round on the analyzer's thread. A
remediator that planned and executed in that call would hold detection for as long as a
control plane takes to answer (a Serve deploy, a hung HTTP call: the lifecycle client waits up
to 600 s): no round would run, and a second fault would wait for the first one's rollback. So
the server hands rounds to this worker: ``submit`` only records the round and returns; one
thread of its own runs the remediator on the rounds in order. Rounds that arrive while it is
busy are merged (each incident's latest state, the latest time), as the remediator reads an
incident's current state and not the history of its states.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from aiops.analytics.incidents import Incident

__all__ = ["RoundWorker"]

log = logging.getLogger(__name__)


class RoundWorker:
    def __init__(self, handle: Callable[[list[Incident], int], None],
                 name: str = "remediation") -> None:
        self._handle = handle
        self._cond = threading.Condition()
        self._changed: dict[str, Incident] = {}
        self._now_ns: int | None = None
        self._stopping = False
        self._busy = False
        self.rounds = 0  # rounds handed to the remediator (merged ones count once)
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, changed: list[Incident], now_ns: int) -> None:
        """A round's changed incidents (the tracker's listener): recorded, never waited on."""
        with self._cond:
            for inc in changed:
                self._changed[inc.incident_id] = inc
            self._now_ns = now_ns if self._now_ns is None else max(self._now_ns, now_ns)
            self._cond.notify()

    def idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until every submitted round is handled (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._now_ns is None and not self._busy,
                                       timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._now_ns is not None)
                if self._stopping:
                    return
                changed, now_ns = list(self._changed.values()), self._now_ns
                self._changed, self._now_ns, self._busy = {}, None, True
            try:
                assert now_ns is not None
                self._handle(changed, now_ns)
                self.rounds += 1
            except Exception:  # log, count and carry on with the next round
                self.failures += 1
                log.exception("remediation of a round failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

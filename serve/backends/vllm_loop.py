"""One thread that steps a vLLM ``LLMEngine`` for every request of the replica at once.

vLLM batches continuously: requests join and leave the running batch between engine steps, and
with the ``priority`` scheduling policy its scheduler takes waiting requests by priority (lower
first) and preempts running lower-priority ones when the KV cache is short. That works only if
every request is in the one engine together, so the engine is driven by this loop alone (vLLM's
``LLMEngine`` is not thread-safe) and callers talk to it through queues: ``submit`` adds a
request and returns the queue its outputs arrive on; ``abort`` drops one whose caller left.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from aiops.errors import ModelError

__all__ = ["BATCH_PRIORITY", "REALTIME_PRIORITY", "EngineLoop"]

log = logging.getLogger(__name__)

REALTIME_PRIORITY, BATCH_PRIORITY = 0, 1  # vLLM serves lower values first

_IDLE_WAIT_S = 0.05  # how long the loop blocks for a new request when the engine is idle


class EngineLoop:
    def __init__(self, engine: Any, name: str) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[tuple[str, Any, Any, int, queue.SimpleQueue[Any]]] = (
            queue.SimpleQueue())
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._outputs: dict[str, queue.SimpleQueue[Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"vllm-loop-{name}", daemon=True)
        self._thread.start()

    def outputs(self, request_id: str, prompt: Any, params: Any, priority: int
                ) -> Iterator[Any]:
        """The engine's outputs for one request, as they come; the request is aborted if the
        caller stops reading before it finished."""
        if self._stop.is_set() or not self._thread.is_alive():
            raise ModelError("the vLLM engine loop is not running")
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._inbox.put((request_id, prompt, params, priority, box))
        finished = False
        try:
            while not finished:
                try:
                    item = box.get(timeout=1.0)
                except queue.Empty:
                    if not self._thread.is_alive():  # died of something it did not expect
                        raise ModelError("the vLLM engine loop stopped") from None
                    continue
                if isinstance(item, BaseException):
                    raise ModelError(f"vLLM failed to answer: {item}") from item
                finished = bool(item.finished)
                yield item
        finally:
            if not finished:
                self._aborts.put(request_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.has_unfinished_requests()
            self._take_new(block=not busy)
            self._take_aborts()
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outs = self.engine.step()
            except Exception as exc:  # the engine failed: every request in flight with it
                log.exception("vLLM engine step failed")
                for box in self._outputs.values():
                    box.put(exc)
                self.engine.abort_request(list(self._outputs))
                self._outputs.clear()
                continue
            for out in outs:
                mine = self._outputs.get(out.request_id)
                if mine is not None:
                    mine.put(out)
                    if out.finished:
                        del self._outputs[out.request_id]
        # Closing: nobody steps the engine any more.
        for box in self._outputs.values():
            box.put(ModelError("the model is shutting down"))

    def _take_new(self, block: bool) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            request_id, prompt, params, priority, box = item
            try:
                self.engine.add_request(request_id, prompt, params, priority=priority)
            except (ValueError, RuntimeError, TypeError) as exc:
                box.put(exc)
                continue
            self._outputs[request_id] = box

    def _take_aborts(self) -> None:
        gone = []
        while True:
            try:
                gone.append(self._aborts.get_nowait())
            except queue.Empty:
                break
        gone = [r for r in gone if self._outputs.pop(r, None) is not None]
        if gone:
            self.engine.abort_request(gone)

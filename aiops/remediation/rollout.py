"""Progressive canary: the new version's traffic goes 5% -> 25% -> 50% -> 100%, each step
gated by comparing its SLIs with the stable version's over that step.

The comparison has to hold on few samples (a 5% step of a slow model sees a handful of
requests), so it uses exact and rank tests rather than thresholds on percentiles: errors by
Fisher's exact test (canary failing more often than stable), latency by the Mann-Whitney U
test (canary slower) together with an effect size (its median beyond ``latency_ratio`` of
stable's and ``latency_floor_ms`` above it), both one-sided at ``alpha``. Too few canary
requests in a step extends it; a breach proposes a rollback, which the remediation policy
decides like any other action.
Every step's verdict is a ledger entry.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from aiops import semconv
from aiops.analytics.findings import NOT_WARMUP
from aiops.errors import AIOpsError
from aiops.remediation.actions import Action, ActionKind, ControlPlane, Target, new_action
from aiops.store import Store

__all__ = ["Gate", "Rollout", "Verdict", "compare"]

log = logging.getLogger(__name__)

NS = 1_000_000_000
DEFAULT_STEPS = (5, 25, 50, 100)

# Version and failed as the detectors read them (aiops.semconv): a 5xx without an error status
# is a failure here as it is to the incident detector.
_SQL = f"""
SELECT {semconv.VERSION} AS version, duration_ns, {semconv.FAILED} AS failed
FROM spans
WHERE service_name = ? AND {semconv.VERSION} IN (?, ?)
  AND start_time >= make_timestamp_ns(?) AND start_time < make_timestamp_ns(?) AND {NOT_WARMUP}
"""


@dataclass(frozen=True)
class Gate:
    # Two tests per step, three or four steps: 0.01 keeps the rollout's overall false-alarm
    # rate near 5% (Bonferroni).
    alpha: float = 0.01
    # A breach must matter as well as be significant: with many requests a rank test finds
    # 1.1 ms against 1.0 ms "significant". The canary's median must exceed stable's by both.
    latency_ratio: float = 1.2
    latency_floor_ms: float = 10.0
    min_samples: int = 8  # canary requests needed before a step can pass


@dataclass
class Verdict:
    ok: bool | None  # None: too few canary requests to judge yet
    reason: str
    canary_n: int = 0
    stable_n: int = 0
    canary_failed: float = 0.0
    stable_failed: float = 0.0
    canary_median_ms: float = 0.0
    stable_median_ms: float = 0.0
    p_errors: float = 1.0
    p_latency: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


def compare(store: Store, model: str, stable: str, canary: str, start_ns: int, end_ns: int,
            gate: Gate | None = None) -> Verdict:
    """The canary against stable over [start, end)."""
    from scipy.stats import fisher_exact, mannwhitneyu

    g = gate or Gate()
    rows = store.query(_SQL, [model, stable, canary, start_ns, end_ns]).rows
    c = [(d, f) for v, d, f in rows if v == canary]
    s = [(d, f) for v, d, f in rows if v == stable]
    v = Verdict(None, "", len(c), len(s))
    if len(c) < g.min_samples or len(s) < g.min_samples:
        v.reason = (f"too few requests to judge: canary {len(c)}, stable {len(s)} "
                    f"(need {g.min_samples} each)")
        return v
    c_fail, s_fail = sum(f for _, f in c), sum(f for _, f in s)
    v.canary_failed, v.stable_failed = c_fail / len(c), s_fail / len(s)
    v.p_errors = float(fisher_exact([[c_fail, len(c) - c_fail], [s_fail, len(s) - s_fail]],
                                    alternative="greater").pvalue)
    c_ms = [d / 1e6 for d, f in c if not f] or [0.0]
    s_ms = [d / 1e6 for d, f in s if not f] or [0.0]
    v.canary_median_ms, v.stable_median_ms = statistics.median(c_ms), statistics.median(s_ms)
    v.p_latency = float(mannwhitneyu(c_ms, s_ms, alternative="greater").pvalue)
    if v.p_errors < g.alpha:
        v.ok, v.reason = False, (f"errors: canary {v.canary_failed:.1%} vs stable "
                                 f"{v.stable_failed:.1%} (Fisher p={v.p_errors:.3g})")
    elif v.p_latency < g.alpha and \
            v.canary_median_ms > g.latency_ratio * v.stable_median_ms and \
            v.canary_median_ms - v.stable_median_ms > g.latency_floor_ms:
        v.ok, v.reason = False, (f"latency: canary median {v.canary_median_ms:.0f} ms vs "
                                 f"stable {v.stable_median_ms:.0f} ms (Mann-Whitney "
                                 f"p={v.p_latency:.3g})")
    else:
        v.ok, v.reason = True, (f"no worse: failed {v.canary_failed:.1%} vs "
                                f"{v.stable_failed:.1%}, median {v.canary_median_ms:.0f} vs "
                                f"{v.stable_median_ms:.0f} ms")
    return v


Propose = Callable[[Action, str, int], dict[str, Any]]


@dataclass
class Rollout:
    """One progressive rollout, run in a thread of the server."""

    model: str
    version: str
    store: Store
    control: Callable[[], AbstractContextManager[ControlPlane]]
    propose: Propose
    steps: tuple[int, ...] = DEFAULT_STEPS
    step_s: float = 60.0
    gate: Gate = field(default_factory=Gate)
    clock: Callable[[], int] = time.time_ns
    rollout_id: str = field(default_factory=lambda: f"ro-{uuid.uuid4().hex[:12]}")
    status: str = "pending"  # running, promoted, rolled_back, halted, failed
    stable: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "model": self.model, "version": self.version,
                "stable": self.stable, "steps": list(self.steps), "step_s": self.step_s,
                "status": self.status, "history": self.history}

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True, name=self.rollout_id)
        thread.start()
        return thread

    def cancel(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.status = "running"
        try:
            with self.control() as control:
                model = control.status().models.get(self.model)
                if model is None or model.version(self.version) is None:
                    raise AIOpsError(f"{self.model} has no version {self.version}: apply it "
                                     "first (unrouted), then roll it out")
                self.stable = model.stable
                if self.stable in (None, self.version):
                    raise AIOpsError(f"{self.model} has no other stable version to compare "
                                     f"{self.version} with")
            for pct in self.steps:
                if self._stop.is_set():
                    self._end("halted", {"reason": "cancelled"})
                    return
                if pct >= 100:
                    with self.control() as control:
                        control.promote(self.model, self.version)
                    self._end("promoted", {"percent": 100})
                    return
                if not self._step(pct):
                    return
        except AIOpsError as exc:
            self._end("failed", {"error": str(exc)})

    def _step(self, pct: int) -> bool:
        """One step; False when the rollout ended in it."""
        with self.control() as control:
            control.canary(self.model, self.version, pct)
        start = self.clock()
        verdict = None
        # Too few canary requests: the step waits longer, up to three times its length.
        for wait in (self.step_s, self.step_s, self.step_s):
            if self._stop.wait(wait):
                self._end("halted", {"reason": "cancelled", "percent": pct})
                return False
            assert self.stable is not None
            verdict = compare(self.store, self.model, self.stable, self.version, start,
                              self.clock(), self.gate)
            if verdict.ok is not None:
                break
        assert verdict is not None
        self._ledger("step", {"percent": pct, "verdict": verdict.to_json(),
                              "passed": bool(verdict.ok)})
        self.history.append({"percent": pct, "ok": verdict.ok, "reason": verdict.reason})
        if verdict.ok:
            return True
        if verdict.ok is None:
            self._end("halted", {"percent": pct, "reason": verdict.reason})
            return False
        action = new_action(None, ActionKind.ROLLBACK, self.model, self.version, self.clock())
        action.reason = f"rollout {self.rollout_id} at {pct}%: {verdict.reason}"
        decided = self.propose(action, "rollout", self.clock())
        ended = "rolled_back" if decided["status"] in ("executed", "verified") else "halted"
        self._end(ended, {"percent": pct, "reason": verdict.reason,
                          "action_id": decided["action_id"], "action": decided["status"]})
        return False

    def _end(self, status: str, detail: dict[str, Any]) -> None:
        self.status = status
        self._ledger(status, detail)
        log.info("rollout %s of %s %s: %s %s", self.rollout_id, self.model, self.version,
                 status, detail)

    def _ledger(self, status: str, detail: dict[str, Any]) -> None:
        now = self.clock()
        self.store.append_many({}, chained={"ledger": [{
            "time": now, "actor": "rollout", "action_id": self.rollout_id, "status": status,
            "kind": "progressive_canary", "target": str(Target(self.model, self.version)),
            "stable": self.stable, "outcome": detail}]})

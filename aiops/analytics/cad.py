"""The CAD-style streaming detector of one metric series: one cheap update per point, bounded
state. :mod:`aiops.analytics.anomaly` builds on it (many series, anomaly records).

``SeriesDetector.update(t, value)`` returns an anomaly score in [0, 1] for the newest point of one
series, using only the points before it. Two views of the series are combined:

* **Contextual novelty** (after the Contextual Anomaly Detector, "CAD OSE", M. Smirnov 2016,
  an entry of the NAB 2016 competition): values are quantised to ``2**bits`` levels, whose bits
  are the "facts" of a point; a memory of contexts (which facts follow which facts, where the
  left side also holds the contexts active one step earlier, i.e. higher-order sequence memory)
  predicts the next point. The raw score is high when the point was not predicted, few of the
  contexts that applied came true, and many of the contexts it forms are new.
  CAD OSE quantises over the whole file's min/max; here the range is learnt online: when a
  value leaves it by more than ``range_tolerance``, the levels are redrawn over the new range
  and the model relearns from the last ``replay`` values, so nothing looks ahead.
* **Range novelty**: how far the value lies outside the min/max of the previous
  ``range_window`` values, as a fraction of that range (a robust "new extreme" test, like the
  spatial anomaly check of Numenta's HTM detector).

A score at or above ``threshold`` is an anomaly, and it opens a quiet period of ``quiet`` points
in which scores are reported as 0: an incident is reported once, when it starts, not on every
point of it (as NAB rewards, and as an on-call engineer would want).

Memory per series is bounded: at most ``max_contexts`` contexts (beyond that the model still
measures novelty but learns nothing new), ``replay`` values and ``range_window`` values. The work
per point is a few numpy passes over the contexts (at most ``max_contexts``) plus Python work for
the contexts that apply to it; redrawing the levels replays ``replay`` points, which happens
only when the series reaches a new extreme. On NAB (365,558 points) that averages about 0.2 ms
a point; a noise-like series that fills the memory costs about 0.5-1 ms a point.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DetectorConfig", "SeriesDetector"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Facts = tuple[int, ...]
Pair = tuple[Facts, Facts]

# Facts of the quantised value (bit s set/unset) and of active contexts live in separate
# ranges, so a sorted tuple of facts keeps value facts first.
_SENSOR_BASE = 1 << 16
_NEURON_BASE = 1 << 31


@dataclass(frozen=True)
class DetectorConfig:
    """Parameters of ``SeriesDetector``; the same for every series (chosen on NAB, see
    ``aiops_harness.evals.nab``)."""

    bits: int = 3                   # 2**bits value levels
    warmup: int = 20                # points before the first model is built
    replay: int = 1000              # recent values relearnt when the levels are redrawn
    range_tolerance: float = 0.05   # range growth (fraction) that redraws the levels
    max_contexts: int = 8000        # context memory bound
    max_active: int = 15            # active contexts carried into the next step's left side
    max_left_facts: int = 7         # largest left side of a context formed by intersection
    range_window: int = 3000        # trailing values for the range-novelty test
    range_margin: float = 0.01      # excess over that range (fraction) that counts as novel
    quiet: int = 20                 # points reported as 0 after an anomaly
    threshold: float = 0.78         # an anomaly (and a quiet period) from here; NAB-optimal

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 8:
            raise ValueError("bits must be in 1..8")
        if min(self.warmup, self.replay, self.max_contexts, self.range_window) < 1:
            raise ValueError("warmup, replay, max_contexts and range_window must be positive")



# -- the context memory --------------------------------------------------------------------


class _LeftSide:
    """Facts on the left of one or more contexts; ``contexts`` maps right side -> context."""

    __slots__ = ("contexts", "facts", "fset", "sid")

    def __init__(self, facts: Facts, sid: int) -> None:
        self.facts = facts
        self.fset = frozenset(facts)
        self.sid = sid
        self.contexts: dict[int, int] = {}


class _ContextMemory:
    """Contexts (left facts -> right facts) with their prediction statistics in numpy arrays.

    "Zero-level" contexts are the literal transitions seen (all left facts -> all facts of the
    next point); further contexts are their intersections with later transitions, which is how
    the memory generalises.
    """

    def __init__(self, max_contexts: int, max_left_facts: int) -> None:
        self.max_contexts = max_contexts
        self.max_left_facts = max_left_facts
        self.lefts: dict[Facts, _LeftSide] = {}
        self.left_list: list[_LeftSide] = []
        # Left sides indexed by their largest fact, then their second largest (None: a single
        # fact), so the sides contained in a fact set are found without scanning them all.
        self.anchor: dict[int, dict[int | None, list[_LeftSide]]] = {}
        self.rights: dict[Facts, int] = {}
        self.right_facts: list[Facts] = []
        self.right_size: IntArray = np.zeros(0, np.int64)
        self.right_matched: list[Facts] = []
        self.right_hits: IntArray = np.zeros(0, np.int64)
        size = 64
        self.c_left = np.zeros(size, np.int64)
        self.c_right = np.zeros(size, np.int64)
        self.c_tried = np.zeros(size, np.int64)      # right facts predicted, summed
        self.c_hit = np.zeros(size, np.int64)        # of those, facts that came true
        self.c_active = np.zeros(size, np.int64)     # times the whole right side came true
        self.c_zero = np.zeros(size, np.bool_)
        self.c_lkey = np.zeros(size, np.int64)       # hashes: a stable order among equals
        self.c_rkey = np.zeros(size, np.int64)
        self.n = 0
        self.new_zero: int | None = None
        self.prev_full: list[_LeftSide] = []
        self.prev_left: frozenset[int] = frozenset()

    def _grow(self) -> None:
        for name in ("c_left", "c_right", "c_tried", "c_hit", "c_active", "c_zero", "c_lkey",
                     "c_rkey"):
            old = getattr(self, name)
            new = np.zeros(2 * len(old), old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _left(self, facts: Facts) -> _LeftSide:
        side = self.lefts.get(facts)
        if side is None:
            side = _LeftSide(facts, len(self.left_list))
            self.lefts[facts] = side
            self.left_list.append(side)
            second = facts[-2] if len(facts) > 1 else None
            self.anchor.setdefault(facts[-1], {}).setdefault(second, []).append(side)
        return side

    def _right(self, facts: Facts) -> int:
        rid = self.rights.get(facts)
        if rid is None:
            rid = len(self.right_facts)
            self.rights[facts] = rid
            self.right_facts.append(facts)
            self.right_size = np.append(self.right_size, len(facts))
        return rid

    def _known(self, pair: Pair) -> int | None:
        side = self.lefts.get(pair[0])
        rid = self.rights.get(pair[1])
        return None if side is None or rid is None else side.contexts.get(rid)

    def learn_transition(self, pair: Pair) -> bool:
        """Record a seen transition as a zero-level context; True if it was new."""
        if self.n >= self.max_contexts:
            cid = self._known(pair)
            if cid is not None:
                self.c_zero[cid] = True
            return cid is None
        side = self._left(pair[0])
        rid = self._right(pair[1])
        cid = side.contexts.get(rid)
        if cid is not None:
            self.c_zero[cid] = True
            return False
        cid = self._add(side, rid, pair)
        self.c_zero[cid] = True
        self.new_zero = cid
        return True

    def learn(self, pairs: Iterable[Pair]) -> int:
        """Add contexts; return how many were new. A full memory counts but keeps nothing."""
        new = 0
        for pair in pairs:
            if self.n >= self.max_contexts:
                new += self._known(pair) is None
                continue
            side = self._left(pair[0])
            rid = self._right(pair[1])
            if rid not in side.contexts:
                self._add(side, rid, pair)
                new += 1
        return new

    def _add(self, side: _LeftSide, rid: int, pair: Pair) -> int:
        cid = self.n
        if cid >= len(self.c_left):
            self._grow()
        self.c_left[cid], self.c_right[cid] = side.sid, rid
        self.c_lkey[cid], self.c_rkey[cid] = hash(pair[0]), hash(pair[1])
        self.n += 1
        side.contexts[rid] = cid
        return cid

    def observe(self, facts: Facts) -> None:
        """Match every right side against the facts of the new point."""
        present = set(facts)
        self.right_matched = [tuple(f for f in r if f in present) for r in self.right_facts]
        self.right_hits = np.fromiter((len(m) for m in self.right_matched), np.int64,
                                      len(self.right_facts))

    def update(self, new_transition: bool) -> tuple[IntArray, int, list[Pair]]:
        """Score the contexts whose left side held one step ago against the new point.

        Returns the contexts that came true, how many applied, and the candidate contexts
        formed by intersecting zero-level contexts with the new transition (only when the
        transition itself was new: otherwise they all exist already).
        """
        n = self.n
        full = np.zeros(len(self.left_list), np.bool_)
        if self.prev_full:
            full[[s.sid for s in self.prev_full]] = True
        left_of, right_of = self.c_left[:n], self.c_right[:n]
        applied = full[left_of]
        if self.new_zero is not None:
            applied[self.new_zero] = False
        size, hits = self.right_size[right_of], self.right_hits[right_of]
        self.c_tried[:n][applied] += size[applied]
        hit = applied & (hits > 0)
        self.c_hit[:n][hit] += hits[hit]
        came_true = hit & (hits == size)
        self.c_active[:n][came_true] += 1
        candidates: list[Pair] = []
        if new_transition:
            candidates = self._intersections(full, hit & ~came_true, hits)
        self.new_zero = None
        return np.flatnonzero(came_true), int(applied.sum()), candidates

    def _intersections(self, full: BoolArray, partial_hit: BoolArray, hits: IntArray
                       ) -> list[Pair]:
        n = self.n
        left_of = self.c_left[:n]
        zero = self.c_zero[:n]
        # Ordered as a scan of left sides by (smallest shared fact, age) would meet them, then
        # by context age: the order decides context ids, and so ties further on.
        found: list[tuple[int, int, int, Facts]] = []
        for cid in np.flatnonzero(partial_hit & zero).tolist():
            side = self.left_list[int(left_of[cid])]
            if len(side.facts) <= self.max_left_facts:
                found.append((side.facts[0], side.sid, cid, side.facts))
        loose = zero & (hits > 0) & ~full[left_of]
        if self.new_zero is not None:
            loose[self.new_zero] = False
        shared: dict[int, Facts | None] = {}
        for cid, sid in zip(np.flatnonzero(loose).tolist(), left_of[loose].tolist(),
                            strict=True):
            if sid not in shared:
                common = self.left_list[sid].fset & self.prev_left
                ok = 0 < len(common) <= self.max_left_facts
                shared[sid] = tuple(sorted(common)) if ok else None
            facts = shared[sid]
            if facts is not None:
                found.append((facts[0], sid, cid, facts))
        found.sort(key=lambda f: f[:3])
        right_of = self.c_right
        return [(facts, self.right_matched[int(right_of[cid])]) for _, _, cid, facts in found]

    def most_active(self, ids: IntArray, k: int) -> list[int]:
        if not len(ids):
            return []
        order = np.lexsort((self.c_rkey[ids], self.c_lkey[ids], self.c_active[ids]))
        return [int(i) for i in ids[order[-k:]]]

    def predict(self, left: Facts) -> set[int]:
        """Facts expected next: the right sides of the applicable contexts that predicted best."""
        present = frozenset(left)
        full: list[_LeftSide] = []
        for last in left:
            by_second = self.anchor.get(last)
            if by_second is None:
                continue
            for second, sides in by_second.items():
                if second is None:
                    full.extend(sides)
                elif second in present:
                    full.extend(s for s in sides if s.fset <= present)
        self.prev_full, self.prev_left = full, present
        if not full:
            return set()
        mask = np.zeros(len(self.left_list), np.bool_)
        mask[[s.sid for s in full]] = True
        ids = np.flatnonzero(mask[self.c_left[: self.n]])
        if not len(ids):
            return set()
        tried = self.c_tried[ids]
        rate = np.where(tried > 0, self.c_hit[ids] / np.maximum(tried, 1), 0.0)
        best = ids[rate == rate.max()]
        out: set[int] = set()
        for rid in np.unique(self.c_right[best]).tolist():
            out.update(self.right_facts[rid])
        return out

    @property
    def size(self) -> int:
        return self.n


class _ContextModel:
    """Quantiser + context memory: the raw contextual-novelty score of each value."""

    def __init__(self, lo: float, hi: float, config: DetectorConfig) -> None:
        self.levels = (1 << config.bits) - 1
        self.lo, self.hi = lo, hi
        self.step = (hi - lo) / self.levels if hi > lo else 1.0
        self.bits = config.bits
        self.max_active = config.max_active
        self.memory = _ContextMemory(config.max_contexts, config.max_left_facts)
        self.left: Facts = ()
        self.expected: set[int] = set()

    def facts(self, value: float) -> Facts:
        level = min(self.levels, max(0, int((value - self.lo) / self.step)))
        return tuple(_SENSOR_BASE + 2 * s + ((level >> s) & 1) for s in range(self.bits))

    def score(self, value: float) -> float:
        now = self.facts(value)
        surprised = any(f not in self.expected for f in now)
        memory = self.memory
        seen: set[Pair] = set()
        new_transition = False
        if self.left:
            seen.add((self.left, now))
            new_transition = memory.learn_transition((self.left, now))
        memory.observe(now)
        came_true, applied, candidates = memory.update(new_transition)
        seen.update(candidates)
        neurons = {_NEURON_BASE + c for c in memory.most_active(came_true, self.max_active)}
        self.left = tuple(sorted(set(now) | neurons))
        new = memory.learn(dict.fromkeys(candidates)) if candidates else 0
        self.expected = memory.predict(self.left)
        if not surprised:
            return 0.0  # the memory expected this value: nothing to report
        # Half: the share of applicable contexts that failed; half: the share of the contexts
        # this step formed (the transition itself counts) that the memory had never seen.
        unconfirmed = 1.0 - (len(came_true) / applied if applied else 0.0)
        novelty = (new + 1) / len(seen) if new_transition and seen else 0.0
        return (unconfirmed + novelty) / 2.0


# -- range novelty -------------------------------------------------------------------------


class _SlidingRange:
    """Min and max of the last ``window`` values (monotonic queues: O(1) amortised)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.count = 0
        self.highs: deque[tuple[int, float]] = deque()
        self.lows: deque[tuple[int, float]] = deque()

    def excess(self, value: float) -> float:
        """How far ``value`` lies outside the range, as a fraction of it (0 inside)."""
        if not self.highs:
            return 0.0
        lo, hi = self.lows[0][1], self.highs[0][1]
        if hi > lo:
            return max(0.0, (value - hi) / (hi - lo), (lo - value) / (hi - lo))
        return 0.0 if value == hi else 1.0  # a flat series that moves

    def push(self, value: float) -> None:
        i = self.count
        self.count += 1
        highs, lows = self.highs, self.lows
        while highs and highs[-1][1] <= value:
            highs.pop()
        while lows and lows[-1][1] >= value:
            lows.pop()
        highs.append((i, value))
        lows.append((i, value))
        # One value leaves the window per push, and it can only be at the front.
        for queue in (highs, lows):
            if queue[0][0] <= i - self.window:
                queue.popleft()


# -- the detector --------------------------------------------------------------------------


class SeriesDetector:
    """Online anomaly scores for one metric series."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.count = 0
        self.last_time: float | None = None
        self.reason = ""
        self._recent: deque[float] = deque(maxlen=self.config.replay)
        self._lo = math.inf
        self._hi = -math.inf
        self._model: _ContextModel | None = None
        self._range = _SlidingRange(self.config.range_window)
        self._last_anomaly = -(10**18)
        self.rebuilds = 0

    def update(self, t: float, value: float) -> float:
        """Score the point (t, value), then learn it. Points that are not finite, or older
        than the last one, score 0 and are not learnt."""
        if not math.isfinite(value) or (self.last_time is not None and t < self.last_time):
            return 0.0
        self.last_time = t
        cfg = self.config
        excess = self._range.excess(value) if self.count >= cfg.warmup else 0.0
        contextual = self._contextual(value)
        extreme = 0.8 + 0.2 * min(1.0, excess) if excess > cfg.range_margin else 0.0
        score = max(contextual, extreme)
        self.reason = "outside its recent range" if extreme >= contextual else "novel pattern"
        self._range.push(value)
        self._recent.append(value)
        i = self.count
        self.count += 1
        quiet = i - self._last_anomaly <= cfg.quiet or i < cfg.quiet
        # Even a score reported as 0 extends the quiet period: the incident is still going on.
        if score >= cfg.threshold:
            self._last_anomaly = i
        return 0.0 if quiet else score

    def _contextual(self, value: float) -> float:
        self._lo, self._hi = min(self._lo, value), max(self._hi, value)
        model = self._model
        if model is None:
            if len(self._recent) + 1 < self.config.warmup:
                return 0.0
            return self._rebuild().score(value)
        span = (model.hi - model.lo) * self.config.range_tolerance
        if value < model.lo - span or value > model.hi + span:
            model = self._rebuild()
        return model.score(value)

    def _rebuild(self) -> _ContextModel:
        """Redraw the levels over the range seen so far and relearn the recent values."""
        model = _ContextModel(self._lo, self._hi, self.config)
        for v in self._recent:
            model.score(v)
        self._model = model
        self.rebuilds += 1
        return model

    @property
    def memory_items(self) -> int:
        """Values and contexts held: bounded by the configuration whatever the series length."""
        contexts = self._model.memory.size if self._model is not None else 0
        return (len(self._recent) + len(self._range.highs) + len(self._range.lows)
                + contexts)

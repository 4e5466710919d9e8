"""Rates of events following events (calls after calls, log templates after templates),
compared per baseline minute so load and request mix cancel out."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping

from aiops.analytics.rca.model import RankConfig
from aiops.analytics.rca.scope import ANOM, END


class Counts:
    """How often event B follows head A, per bucket: ``heads[(ent, A)][bucket]`` and
    ``pairs[(ent, A, B)][bucket]`` (bucket ANOM holds the anomaly window)."""

    def __init__(self) -> None:
        self.heads: dict[tuple[str, str], dict[int, int]] = defaultdict(
            lambda: defaultdict(int))
        self.pairs: dict[tuple[str, str, str], dict[int, int]] = defaultdict(
            lambda: defaultdict(int))
        self.example: dict[tuple[str, str, str], str] = {}

    def add(self, ent: str, a: str, b: str, bucket: int, n: int = 1, example: str = ""
            ) -> None:
        self.pairs[(ent, a, b)][bucket] += n
        self.heads[(ent, a)][bucket] += n
        if bucket == ANOM and example:
            self.example.setdefault((ent, a, b), example)

    def count_silent_executions(self, execs: Mapping[tuple[str, str, int], int]) -> None:
        """Executions of an operation head its start transitions, and those that made no
        event at all go from start straight to END (only for operations seen making one)."""
        for (ent, op, bucket), n in execs.items():
            head = (ent, f"<start of {op}>")
            if head not in self.heads:
                continue
            made = self.heads[head].get(bucket, 0)
            if n > made:
                self.heads[head][bucket] = n
                self.pairs[(*head, END)][bucket] += n - made

    def usual_next(self, ent: str, head: str) -> str:
        """The event that most often followed ``head`` in the baseline."""
        best, best_n = END, 0
        for (e, a, b), counts in self.pairs.items():
            n = sum(v for k, v in counts.items() if k != ANOM)
            if e == ent and a == head and b != END and n > best_n:
                best, best_n = b, n
        return best

    def scored(self, cfg: RankConfig
               ) -> Iterator[tuple[tuple[str, str, str], float, float, float]]:
        """(key, score, anomaly rate, baseline rate) of every pair past the threshold."""
        for key, counts in self.pairs.items():
            scored = _rate_shift(counts, self.heads[(key[0], key[1])], cfg)
            if scored is not None:
                yield key, *scored


def _rate_shift(counts: Mapping[int, int], heads: Mapping[int, int], cfg: RankConfig
                ) -> tuple[float, float, float] | None:
    """(score, anomaly rate, baseline rate) of B per A, or None below the threshold.

    The baseline rate is the head-weighted median of its minutes' rates. The noise is a
    proportion's (binomial; a count's, Poisson, for rates above one) in both windows, with
    the rate shrunk off 0 and 1 by half a count, plus however much the baseline minutes
    differ among themselves beyond that (a robust spread: disturbed minutes do not widen it).
    A rise counts ``appear_weight`` of a fall.
    """
    na, ca = heads.get(ANOM, 0), counts.get(ANOM, 0)
    base = [(counts.get(k, 0) / v, v) for k, v in heads.items() if k != ANOM and v > 0]
    nb = sum(v for _, v in base)
    if na < cfg.min_execs or nb < cfg.min_execs:
        return None
    rate = _weighted_median(base)
    p = (rate * nb + 0.5) / (nb + 1.0)
    unit = p * (1 - p) if p < 1 else p
    spread = 1.4826 * _weighted_median([(abs(r - rate), v) for r, v in base])
    excess = max(0.0, spread * spread - unit * len(base) / nb)
    observed = ca / na
    z = (observed - rate) / math.sqrt(unit / na + unit / nb + excess)
    if z > 0:
        z *= cfg.appear_weight
    if abs(z) < cfg.threshold:
        return None
    return abs(z), observed, rate


def _weighted_median(values: Iterable[tuple[float, int]]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    half = sum(w for _, w in ordered) / 2
    acc = 0
    for v, w in ordered:
        acc += w
        if acc >= half:
            return v
    return ordered[-1][0]

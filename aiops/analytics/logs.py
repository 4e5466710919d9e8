"""Log templates: a streaming miner (Drain, via drain3) and new-template / template-rate anomalies.

A log body goes through three steps, the same for every system (nothing here is tuned per source):

1. *Masking*: values whose shape gives them away (timestamps, IPs, hex, UUIDs, paths, numbers,
   ``prefix_123`` ids) become typed masks such as ``<:NUM:>``, so that they never split a template.
2. *Clustering*: drain3's prefix tree groups the masked token sequences. On top of its clusters
   this module keeps, per token position, a finer merge (``rhost=1.2.3.4`` and ``rhost=5.6.7.8``
   give ``rhost=<*>``, not ``<*>``) and the few distinct words a position takes: a position that
   only ever holds a handful of digit-free words (``startup``/``shutdown``, ``SCREEN_ON``/``OFF``)
   is an enumeration, part of the template, not a variable.
3. *Canonical form*: :func:`to_loghub` writes the result in the Loghub-2.0 convention (``<*>`` for
   every variable, the benchmark's template-correction rules), so templates can be scored against
   published ground truth and read the same way live.

:class:`TemplateRateDetector` then counts messages per template and time bucket and reports
templates never seen before and buckets whose count departs from the template's robust baseline.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig
from scipy import stats

__all__ = [
    "MASKS",
    "LogTemplates",
    "Template",
    "TemplateAnomaly",
    "TemplateMatch",
    "TemplateRateDetector",
    "mine",
    "to_loghub",
]

WILDCARD = "<*>"
# drain3 writes masks as prefix + name + suffix; "<:" ... ":>" cannot be confused with text in a
# log (a literal "<*>" or "<init>"), and Drain's own wildcard becomes "<:*:>".
_PREFIX, _SUFFIX = "<:", ":>"
_DRAIN_WILDCARD = f"{_PREFIX}*{_SUFFIX}"
_MASK_RE = re.compile(r"<:[A-Z*]+:>")

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
# Lookarounds instead of \b: a value ends at anything that is not a letter, digit or underscore.
_L, _R = r"(?<![A-Za-z0-9_])", r"(?![A-Za-z0-9_])"

# (mask name, pattern), applied in order: the most specific shapes first.
MASKS: tuple[tuple[str, str], ...] = (
    # ctime / date(1): "Fri Jul 01 08:16:53 PDT 2005".
    ("TIME", rf"{_L}{_DAY}\s+{_MONTH}\s+\d{{1,2}}\s+\d{{1,2}}:\d{{2}}:\d{{2}}"
             rf"(?:\s+[A-Z]{{3,4}})?(?:\s+\d{{4}})?{_R}"),
    ("TIME", rf"{_L}\d{{4}}-\d{{2}}-\d{{2}}[T ]\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?"
             rf"(?:Z|[+-]\d{{2}}:?\d{{2}})?{_R}"),
    ("UUID", rf"{_L}[0-9a-fA-F]{{8}}-(?:[0-9a-fA-F]{{4}}-){{3}}[0-9a-fA-F]{{12}}{_R}"),
    ("IP", rf"{_L}\d{{1,3}}(?:\.\d{{1,3}}){{3}}{_R}"),
    # MAC addresses and other colon-separated byte strings.
    ("MAC", rf"{_L}[0-9A-Fa-f]{{2}}(?::[0-9A-Fa-f]{{2}}){{3,}}{_R}"),
    ("HEX", rf"{_L}0[xX][0-9a-fA-F]+{_R}"),
    # Bare hex words: at least 8 hex digits with a digit and a letter among them.
    ("HEX", rf"{_L}(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{{8,}}{_R}"),
    # An absolute path, wherever a value may start (line start, space, quote, bracket, =, :).
    ("PATH", r"(?:^|(?<=[\s'\"(\[=:,]))(?:/+[\w.\-@+~%]+)+/?"),
    # Prefixed ids: blk_-123, job_1445_0001, attempt_12.
    ("ID", rf"{_L}[A-Za-z][A-Za-z0-9]*_-?\d+(?:_\d+)*{_R}"),
    # Numbers, versions (v1.2.3) and words that start with a digit (16K, 0MB, 80x25, 8a2a501).
    ("NUM", rf"{_L}[-+]?[vV]?\d+(?:\.\d+)*{_R}"),
    ("NUM", rf"{_L}\d[A-Za-z0-9]*{_R}"),
)


@dataclass(frozen=True)
class TemplateMatch:
    """Where one message went: ``template_id`` is its Drain cluster, stable while the cluster's
    template generalises; ``template`` the message's template in Loghub form; ``is_new`` that
    the message opened the cluster."""

    template_id: int
    template: str
    is_new: bool


@dataclass(frozen=True)
class Template:
    template_id: int
    template: str
    count: int


# -- canonical (Loghub-2.0) form -------------------------------------------------------------

# The benchmark's template-correction rules (Khan et al., ICSE 2022, as used by Loghub-2.0 to
# correct its ground truth): the same delimiters, applied to predicted templates so that both
# sides follow one convention.
_PATH_DELIMS = r"(\s|,|!|;|:|=|\||\"|'|\[|\]|\(|\)|\{|\})"
_TOKEN_DELIMS = r"(\s|,|!|;|:|=|\||\"|'|\[|\]|\(|\)|\{|\}|\.|-|\+|@|#|\$|%|&)"
_PLACEHOLDER_WORDS = frozenset({"true", "false", "null", "root", "admin"})


def to_loghub(template: str) -> str:
    """Write a template in the Loghub-2.0 convention: masks become ``<*>``, then the benchmark's
    correction rules (paths, booleans and default user names, digits, words glued to a variable,
    dot-separated and adjacent variables)."""
    text = _MASK_RE.sub(WILDCARD, template)
    text = re.sub(r"\s+", " ", text.strip())
    text = "".join(WILDCARD if re.fullmatch(r"(/[^/]+)+", t) else t
                   for t in re.split(_PATH_DELIMS, text))
    text = "".join(_correct_token(t) for t in re.split(_TOKEN_DELIMS, text))
    text = _collapse(text, "<*>.<*>")
    return _collapse(text, "<*><*>")


def _correct_token(token: str) -> str:
    if token.lower() in _PLACEHOLDER_WORDS or token.isdecimal():
        return WILDCARD
    # A word glued to a variable is one variable; "<*>/<*>" stays (a slash is not a delimiter).
    if re.fullmatch(r"[^\s/]*<\*>[^\s/]*", token) and token != "<*>/<*>":
        return WILDCARD
    return token


def _collapse(text: str, pair: str) -> str:
    while pair in text:
        text = text.replace(pair, WILDCARD)
    return text


# -- the miner -------------------------------------------------------------------------------

# Sub-tokens for the fine merge: a mask, a word, or one other character.
_PIECES = re.compile(r"<:[A-Z*]+:>|[A-Za-z0-9_]+|[^A-Za-z0-9_]")


def _merge(a: str, b: str) -> str:
    """The most specific token covering both: their common leading and trailing pieces around one
    wildcard (``rhost=<*>``, ``'<*>'``, ``core.<*>``)."""
    if a == b:
        return a
    xs, ys = _PIECES.findall(a), _PIECES.findall(b)
    shorter = min(len(xs), len(ys))
    head = 0
    while head < shorter and xs[head] == ys[head]:
        head += 1
    tail = 0
    while tail < shorter - head and xs[-1 - tail] == ys[-1 - tail]:
        tail += 1
    return "".join(xs[:head]) + _DRAIN_WILDCARD + "".join(xs[len(xs) - tail:])


_GLUED_MASK = re.compile(r"\w<:|:>[\w.]")


def _is_word(token: str) -> bool:
    """A value that could be part of an enumeration: no digits outside its masks, and no mask
    glued to a word or a dot (``<:NUM:>.dsl.example.net`` is a host name, a variable)."""
    if _GLUED_MASK.search(token):
        return False
    return not any(c.isdigit() for c in _MASK_RE.sub("", token))


@dataclass
class _Slot:
    """One token position of a cluster: its merged token and the distinct values it took,
    while they stay few (``None`` once they are too many to be an enumeration)."""

    merged: str
    values: set[str] | None


@dataclass
class _Cluster:
    slots: list[_Slot]
    count: int = 0

    def update(self, tokens: list[str], enum_max: int) -> None:
        self.count += 1
        for slot, token in zip(self.slots, tokens, strict=True):
            slot.merged = _merge(slot.merged, token)
            if slot.values is not None and token not in slot.values:
                slot.values.add(token)
                if len(slot.values) > enum_max or not all(map(_is_word, slot.values)):
                    slot.values = None

    def render(self, tokens: list[str] | None) -> str:
        """The template of ``tokens`` (a message of this cluster), or of the cluster itself."""
        out = []
        for i, slot in enumerate(self.slots):
            enumerated = slot.values is not None and len(slot.values) > 1
            # In an enumeration the message's own value is part of its template.
            out.append(tokens[i] if enumerated and tokens is not None else slot.merged)
        return to_loghub(" ".join(out))


class LogTemplates:
    """Streaming template miner: one instance per log stream (service, system)."""

    def __init__(self, *, sim_th: float = 0.5, depth: int = 4, max_children: int = 100,
                 max_clusters: int | None = None, enum_max: int = 3) -> None:
        config = TemplateMinerConfig()
        config.drain_sim_th = sim_th
        config.drain_depth = depth
        config.drain_max_children = max_children
        config.drain_max_clusters = max_clusters
        config.mask_prefix, config.mask_suffix = _PREFIX, _SUFFIX
        config.masking_instructions = [MaskingInstruction(p, name) for name, p in MASKS]
        config.parametrize_numeric_tokens = True
        self._miner = TemplateMiner(config=config)
        self._clusters: dict[int, _Cluster] = {}
        self._enum_max = enum_max
        self._max_clusters = max_clusters

    def tokens(self, body: str) -> list[str]:
        """The masked tokens Drain sees for ``body``."""
        drain = self._miner.drain
        return list(drain.get_content_as_tokens(self._miner.masker.mask(body)))

    def add(self, body: str) -> TemplateMatch:
        # drain3's own add_log_message hides the masked tokens, which the slots need; calling
        # its masker and Drain directly masks each body once.
        masked = self._miner.masker.mask(body)
        cluster, change = self._miner.drain.add_log_message(masked)
        tokens = self._miner.drain.get_content_as_tokens(masked)
        cid = int(cluster.cluster_id)
        state = self._clusters.get(cid)
        if state is None:
            state = self._clusters[cid] = _Cluster([_Slot(t, {t}) for t in tokens])
            self._forget_evicted()
        state.update(tokens, self._enum_max)
        return TemplateMatch(cid, state.render(tokens), change == "cluster_created")

    def _forget_evicted(self) -> None:
        """With ``max_clusters``, Drain evicts the least recently used clusters; drop their
        state too (in batches, so that this stays cheap per message)."""
        if self._max_clusters and len(self._clusters) > 2 * self._max_clusters:
            alive = self._miner.drain.id_to_cluster
            self._clusters = {k: v for k, v in self._clusters.items() if k in alive}

    def template_of(self, template_id: int, body: str) -> str:
        """The template of ``body`` (added earlier to ``template_id``) as the cluster stands now:
        later messages may have generalised it."""
        return self._clusters[template_id].render(self.tokens(body))

    def templates(self) -> list[Template]:
        """Every cluster with its generalised template, most frequent first."""
        found = [Template(cid, c.render(None), c.count) for cid, c in self._clusters.items()]
        return sorted(found, key=lambda t: (-t.count, t.template_id))


def mine(bodies: Iterable[str], miner: LogTemplates | None = None) -> list[str]:
    """The final template of every body: all are added first, then each is rendered against its
    cluster's final state (as a batch parser reports it)."""
    miner = miner or LogTemplates()
    lines = list(bodies)
    ids = [miner.add(b).template_id for b in lines]
    return [miner.template_of(cid, b) for cid, b in zip(ids, lines, strict=True)]


# -- anomalies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateAnomaly:
    """One finding for one template and time bucket ``[window_start_ns, window_end_ns)``.

    ``kind`` is ``"new_template"`` (a template first seen after the warm-up; ``expected`` 0) or
    ``"rate"`` (a count far from the template's baseline, above or below it). ``score`` is
    ``-log10`` of the tail probability of ``observed`` under the baseline (``inf`` for a new
    template).
    """

    kind: Literal["new_template", "rate"]
    template_id: int
    template: str
    window_start_ns: int
    window_end_ns: int
    observed: int
    expected: float
    score: float


@dataclass
class _Series:
    template: str
    counts: deque[int]


class TemplateRateDetector:
    """Streaming per-template counts in fixed time buckets, each closed bucket checked against
    the template's own recent buckets.

    The baseline of a template is robust to earlier bursts: its expected count is the larger of
    the median and the 10%-trimmed mean of the last ``history`` buckets (the mean keeps sporadic
    templates above zero), and its spread the MAD. Counts are Poisson around the expectation, or
    negative binomial when the MAD says they are over-dispersed; a bucket is anomalous when its
    count is that unlikely (``-log10 p >= threshold``) and at least ``min_delta`` away.
    Messages must come roughly in time order: one older than the open bucket counts in it.
    """

    def __init__(self, bucket_ns: int = 60 * 10**9, *, history: int = 60, warmup: int = 10,
                 threshold: float = 6.0, min_delta: float = 3.0) -> None:
        if bucket_ns <= 0 or warmup < 1 or history < warmup:
            raise ValueError("need bucket_ns > 0 and 1 <= warmup <= history")
        self.bucket_ns = bucket_ns
        self.history, self.warmup = history, warmup
        self.threshold, self.min_delta = threshold, min_delta
        self._series: dict[int, _Series] = {}
        self._bucket: int | None = None  # index of the open bucket
        self._closed = 0  # buckets closed so far
        self._counts: dict[int, int] = {}
        self._new: set[int] = set()

    def observe(self, time_ns: int, match: TemplateMatch) -> list[TemplateAnomaly]:
        """Count one message; returns the anomalies of the buckets this message closed."""
        bucket = time_ns // self.bucket_ns
        found = []
        if self._bucket is None:
            self._bucket = bucket
        elif bucket > self._bucket:
            found = self._close_until(bucket)
        series = self._series.get(match.template_id)
        if series is None:
            series = self._series[match.template_id] = _Series(match.template,
                                                               deque(maxlen=self.history))
            if self._closed >= self.warmup:
                self._new.add(match.template_id)
        series.template = match.template
        self._counts[match.template_id] = self._counts.get(match.template_id, 0) + 1
        return found

    def flush(self) -> list[TemplateAnomaly]:
        """Close the open bucket (end of a replay, or a clock tick with no messages)."""
        if self._bucket is None:
            return []
        return self._close_until(self._bucket + 1)

    def _close_until(self, bucket: int) -> list[TemplateAnomaly]:
        """Close the open bucket and the empty ones up to ``bucket``. After ``history`` empty
        buckets every baseline is all zeros, so a longer silence changes nothing more."""
        assert self._bucket is not None
        found = []
        for b in range(self._bucket, min(bucket, self._bucket + self.history + 1)):
            found += self._close(b)
        self._bucket = bucket
        return found

    def _close(self, bucket: int) -> list[TemplateAnomaly]:
        window = (bucket * self.bucket_ns, (bucket + 1) * self.bucket_ns)
        found = []
        for tid, series in self._series.items():
            observed = self._counts.get(tid, 0)
            if tid in self._new:
                found.append(TemplateAnomaly("new_template", tid, series.template, *window,
                                             observed, 0.0, math.inf))
            elif len(series.counts) >= self.warmup:
                anomaly = self._rate(tid, series, observed, window)
                if anomaly is not None:
                    found.append(anomaly)
            series.counts.append(observed)
        self._counts.clear()
        self._new.clear()
        self._closed += 1
        return sorted(found, key=lambda a: -a.score)

    def _rate(self, tid: int, series: _Series, observed: int,
              window: tuple[int, int]) -> TemplateAnomaly | None:
        expected, variance = _baseline(np.asarray(series.counts, dtype=np.float64))
        if abs(observed - expected) < self.min_delta:
            return None
        score = _surprise(observed, expected, variance)
        if score < self.threshold:
            return None
        return TemplateAnomaly("rate", tid, series.template, *window, observed, expected, score)


def _baseline(counts: npt.NDArray[np.float64]) -> tuple[float, float]:
    """Robust expected count and variance of a template's past buckets."""
    median = float(np.median(counts))
    expected = max(median, float(stats.trim_mean(counts, 0.1)), 0.5)
    spread = 1.4826 * float(np.median(np.abs(counts - median)))
    return expected, spread * spread


def _surprise(observed: int, expected: float, variance: float) -> float:
    """``-log10`` of the probability of a count at least as far out as ``observed``."""
    if variance > expected:  # over-dispersed: negative binomial with this mean and variance
        n, p = expected * expected / (variance - expected), expected / variance
        tail = (stats.nbinom.sf(observed - 1, n, p) if observed > expected
                else stats.nbinom.cdf(observed, n, p))
    else:
        tail = (stats.poisson.sf(observed - 1, expected) if observed > expected
                else stats.poisson.cdf(observed, expected))
    return -math.log10(max(float(tail), 1e-300))

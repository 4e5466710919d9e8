"""Log templates: a streaming miner (Drain, via drain3), and the package's log-template API.

A log body goes through three steps, the same for every system (nothing here is tuned per source):

1. *Masking* (:mod:`aiops.analytics.logmasks`): values whose shape gives them away become typed
   masks such as ``<:NUM:>``, so that they never split a template.
2. *Clustering* (here): drain3's prefix tree groups the masked token sequences, and a cluster that
   comes out like one elsewhere in the tree (same length, most tokens equal: a variable word in
   front, where Drain's tree expects constants) joins its group. Per group and token position
   this module keeps a finer merge (``rhost=1.2.3.4`` and ``rhost=5.6.7.8`` give ``rhost=<*>``,
   not ``<*>``) and the few distinct words a position takes: a position that only ever holds a
   handful of digit-free words (``startup``/``shutdown``, ``SCREEN_ON``/``OFF``) is an
   enumeration, part of the template, not a variable.
3. *Canonical form* (:func:`~aiops.analytics.logmasks.to_loghub`): the result in the Loghub-2.0
   convention, so templates can be scored against published ground truth and read the same way
   live.

No rule names a system or its format. Which parameters were chosen on which data, and how the
miner does on a system left out of that choice, is :mod:`aiops_harness.evals.loghub_loso`'s report.

New-template and template-rate anomalies are :mod:`aiops.analytics.logrates`'
(:class:`TemplateRateDetector`); this module re-exports them, with :data:`MASKS` and
:func:`to_loghub`, so that ``aiops.analytics.logs`` stays the one import for all of it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from drain3 import TemplateMiner
from drain3.drain import Drain, LogCluster
from drain3.template_miner_config import TemplateMinerConfig

from aiops.analytics.logmasks import (
    _DRAIN_WILDCARD,
    _MASK_RE,
    _MASKER,
    _PREFIX,
    _SUFFIX,
    MASKS,
    WILDCARD,
    _mask,
    to_loghub,
)
from aiops.analytics.logrates import TemplateAnomaly, TemplateRateDetector

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


def _enum_key(token: str) -> str | None:
    """What ``token`` is to an enumeration: a word (itself: no digits outside its masks, and no
    mask glued to a word or a dot, as in the host name ``<:NUM:>.dsl.example.net``), a bare
    value (masks and punctuation only, ``<:IP:>:<:NUM:>``: all such values are one value, the
    wildcard), or neither (``None``: a variable, so the position is no enumeration)."""
    if _GLUED_MASK.search(token):
        return None
    rest = _MASK_RE.sub("", token)
    if any(c.isdigit() for c in rest):
        return None
    if rest != token and not any(c.isalpha() for c in rest):
        return _DRAIN_WILDCARD
    return token


@dataclass
class _Slot:
    """A token position of a group: its merged token and distinct values (:func:`_enum_key`),
    ``None`` once they are too many or one is a variable (no enumeration)."""

    merged: str
    values: set[str] | None


@dataclass
class _Group:
    """One template group: a Drain cluster and the clusters that joined it."""

    slots: list[_Slot]
    members: set[int]  # Drain cluster ids
    count: int = 0

    def update(self, tokens: list[str], enum_max: int) -> None:
        self.count += 1
        for slot, token in zip(self.slots, tokens, strict=True):
            slot.merged = _merge(slot.merged, token)
            if slot.values is not None:
                key = _enum_key(token)
                if key is None:
                    slot.values = None
                else:
                    slot.values.add(key)
                    slot.values = slot.values if len(slot.values) <= enum_max else None

    def absorb(self, other: _Group, enum_max: int) -> None:
        self.count += other.count
        self.members |= other.members
        for slot, theirs in zip(self.slots, other.slots, strict=True):
            slot.merged = _merge(slot.merged, theirs.merged)
            values = (slot.values or set()) | (theirs.values or set())
            both = slot.values is not None and theirs.values is not None
            slot.values = values if both and len(values) <= enum_max else None

    def enumerated(self, enum_support: float) -> list[bool]:
        """Positions that are enumerations: a few words, seen ``enum_support`` times each on
        average (three users in three messages may as well be a variable)."""
        return [slot.values is not None and len(slot.values) > 1
                and self.count >= enum_support * len(slot.values) for slot in self.slots]

    def render(self, tokens: list[str] | None, enum_support: float) -> str:
        """The template of ``tokens`` (a message of this group), or of the group itself."""
        out = [s.merged for s in self.slots]
        for i, enum in enumerate(self.enumerated(enum_support)):
            # In an enumeration the message's own word is part of its template.
            if enum and tokens is not None:
                out[i] = tokens[i] if tokens[i] in (self.slots[i].values or ()) else _DRAIN_WILDCARD
        return to_loghub(" ".join(out))


class _Drain(Drain):  # type: ignore[misc]  # drain3 is untyped
    """drain3's Drain, except that a message placed in the tree may always differ from a
    template in one token. Drain wants ``sim_th`` of the tokens to agree, and in a short
    message one variable is a large share: a 2-token message agrees with its kin on 1/2, so
    above a threshold of 0.5 every value became a template of its own (Zookeeper's
    ``Server environment:key=value`` lines at 0.6: 7 templates for 1). Recurring words that
    are not variables are still kept apart by the enumeration rule, as in long messages.
    Inert at thresholds up to 0.5, the default's among them."""

    def fast_match(self, cluster_ids: Iterable[int], tokens: list[str], sim_th: float,
                   include_params: bool) -> LogCluster | None:
        n = len(tokens)
        if n >= 2 and not include_params:  # placement only, not the join's full search
            sim_th = min(sim_th, (n - 1) / n)
        return super().fast_match(cluster_ids, tokens, sim_th, include_params)


class LogTemplates:
    """Streaming template miner: one instance per log stream (service, system).

    ``sim_th`` and ``depth`` are drain3's; ``enum_max`` is the most distinct words a position
    may take and still be an enumeration (0: never), ``enum_support`` how many messages per
    distinct word it needs. ``join_th``: a new or generalised Drain cluster joins the group of
    a cluster of the same length elsewhere in Drain's prefix tree when that share of their
    tokens agree (drain3's full-search similarity; ``None``: never). Drain's tree takes the
    first tokens for constants, so a variable word in front (a program or host name) gives a
    cluster per value; joining undoes that, and the enumeration rule still keeps apart a few
    recurring words.

    The defaults are frozen: the setting that :mod:`aiops_harness.evals.loghub_loso` chooses on all
    seven Loghub-2.0 2k systems at hand; its leave-one-system-out figures are the ones that
    speak for other systems.
    """

    def __init__(self, *, sim_th: float = 0.4, depth: int = 4, max_children: int = 100,
                 max_clusters: int | None = None, enum_max: int = 3,
                 enum_support: float = 1.0, join_th: float | None = 0.8) -> None:
        config = TemplateMinerConfig()
        config.drain_sim_th = sim_th
        config.drain_depth = depth
        config.drain_max_children = max_children
        config.drain_max_clusters = max_clusters
        config.mask_prefix, config.mask_suffix = _PREFIX, _SUFFIX
        config.masking_instructions = list(_MASKER.masking_instructions)
        config.parametrize_numeric_tokens = True
        self._miner = TemplateMiner(config=config)
        d = self._miner.drain
        self._miner.drain = _Drain(sim_th=sim_th, depth=depth, max_children=max_children,
                                   max_clusters=max_clusters, profiler=d.profiler,
                                   extra_delimiters=d.extra_delimiters, param_str=d.param_str,
                                   parametrize_numeric_tokens=True)
        self._group_of: dict[int, int] = {}  # Drain cluster id -> group id
        self._alias: dict[int, int] = {}  # id of a group that joined another -> that group
        self._groups: dict[int, _Group] = {}
        self._enum_max, self._enum_support = enum_max, enum_support
        self._join_th = join_th
        self._max_clusters = max_clusters

    def tokens(self, body: str) -> list[str]:
        """The masked tokens Drain sees for ``body``."""
        return list(self._miner.drain.get_content_as_tokens(_mask(body)))

    def add(self, body: str) -> TemplateMatch:
        gid, tokens, is_new = self._add(body)
        return TemplateMatch(gid, self._render(gid, tokens), is_new)

    def _add(self, body: str) -> tuple[int, list[str], bool]:
        # drain3's own add_log_message hides the masked tokens, which the slots need; calling
        # the masker and Drain directly masks each body once.
        masked = _mask(body)
        drain = self._miner.drain
        cluster, change = drain.add_log_message(masked)
        tokens = drain.get_content_as_tokens(masked)
        cid = int(cluster.cluster_id)
        gid = self._group_of.get(cid)
        is_new = gid is None
        if gid is None:
            gid = self._group_of[cid] = cid
            self._groups[gid] = _Group([_Slot(t, set()) for t in tokens], {cid})
            self._forget_evicted()
        self._groups[gid].update(tokens, self._enum_max)
        if change != "none" and self._join_th is not None:
            # A new or generalised cluster may now match one elsewhere in the tree.
            joined = self._join(cid, list(cluster.log_template_tokens))
            if joined is not None:
                gid, is_new = joined, False
        return gid, tokens, is_new

    def _render(self, template_id: int, tokens: list[str] | None) -> str:
        group = self._groups[self._alias.get(template_id, template_id)]
        return group.render(tokens, self._enum_support)

    def _join(self, cid: int, template: list[str]) -> int | None:
        """Join the group of Drain cluster ``cid`` to that of the most similar cluster of the
        same length in another group, if similar enough (drain3's full-search similarity, its
        wildcards matching anything); returns the surviving group."""
        if not template:
            return None
        drain = self._miner.drain
        gid = self._group_of[cid]
        others = [c for c in drain.get_clusters_ids_for_seq_len(len(template))
                  if self._group_of.get(c, gid) != gid]
        assert self._join_th is not None
        best = drain.fast_match(others, template, self._join_th, include_params=True)
        if best is None:
            return None
        # The larger group keeps its id, so that the ids of frequent templates stay stable.
        keep, gone = gid, self._group_of[int(best.cluster_id)]
        if (self._groups[gone].count, -gone) > (self._groups[keep].count, -keep):
            keep, gone = gone, keep
        absorbed = self._groups.pop(gone)
        self._groups[keep].absorb(absorbed, self._enum_max)
        for member in absorbed.members:
            self._group_of[member] = keep
        self._alias = {a: keep if g == gone else g for a, g in self._alias.items()}
        self._alias[gone] = keep
        return keep

    def _forget_evicted(self) -> None:
        """With ``max_clusters``, Drain evicts the least recently used clusters; drop their
        state too (in batches, so that this stays cheap per message)."""
        if self._max_clusters and len(self._group_of) > 2 * self._max_clusters:
            alive = self._miner.drain.id_to_cluster
            self._group_of = {c: g for c, g in self._group_of.items() if c in alive}
            kept = set(self._group_of.values())
            self._groups = {g: s for g, s in self._groups.items() if g in kept}
            for group in self._groups.values():
                group.members = {c for c in group.members if c in alive}
            self._alias = {a: g for a, g in self._alias.items() if g in kept}

    def template_of(self, template_id: int, body: str) -> str:
        """The template of ``body`` (added earlier to ``template_id``) as the group stands now:
        later messages may have generalised it."""
        return self._render(template_id, self.tokens(body))

    def templates(self) -> list[Template]:
        """Every group with its generalised template, most frequent first."""
        found = [Template(gid, g.render(None, self._enum_support), g.count)
                 for gid, g in self._groups.items()]
        return sorted(found, key=lambda t: (-t.count, t.template_id))


def mine(bodies: Iterable[str], miner: LogTemplates | None = None) -> list[str]:
    """The final template of every body: all are added first, then each is rendered against its
    group's final state (as a batch parser reports it). Templates that differ only in how many
    variables stand in a row (``to delete <*> <*>`` and ``to delete <*> <*> <*>``: a list of
    values, which Drain splits by token count) are one template, spelt as most lines spell it."""
    miner = miner or LogTemplates()
    added = [miner._add(b) for b in bodies]
    templates = [miner._render(gid, tokens) for gid, tokens, _ in added]
    spelling: dict[str, str] = {}
    for template, _ in Counter(templates).most_common():
        spelling.setdefault(_RUN.sub(WILDCARD, template), template)
    return [spelling[_RUN.sub(WILDCARD, t)] for t in templates]


_RUN = re.compile(r"<\*>(?:\s+<\*>)+")

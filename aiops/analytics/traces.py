"""Trace anomalies: latency and errors per operation against a baseline.

Per (service, span name, model version) the current window is compared with a baseline: the
same group's own recent history when it has enough of it, else its sibling versions (a canary
that misbehaves from its first request has no history of its own; its stable version is the
reference). Two tests per signal, either may fire:

* a *shift*: the window's median against the baseline's median and median absolute deviation
  (latency), or the failed share against the baseline's (errors), over ``min_spans`` or more;
* a *tail* test that needs fewer spans: how many of the window's spans are beyond what the
  baseline almost never does (slower than its 99th percentile, and by the shift test's margins;
  or failed), and how unlikely that count is if the window were drawn from the baseline
  (binomial tail below ``tail_alpha``, and at least two such spans). A canary whose first two
  requests are both far slower than anything its stable version served is found on those two,
  while one slow request, or two among many, is not an anomaly.

Requests still open count too (``serve.inflight``: a replica reports the ages of its oldest
open requests at every metric export): each is a span at least as slow as it is old, so a
canary whose requests take 5 s more is found while they run, not 5 s later. A report of a
request whose span has arrived since is not counted twice.

Where the model has an SLO, its latency threshold is a floor for both tests (except for a
version that just changed, ``Finding.change``, with no other version serving beside it: a
regression that came with a release or an in-place config change is the change's doing, not
contention's): slower than the
baseline is a finding only when it is also slower than what the model's users were promised.
Except where another version of the model, in the same window, serves at its usual speed:
contention (what the floor is for) would have slowed it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from scipy import stats

from aiops import semconv
from aiops.analytics.findings import (
    NOT_WARMUP,
    Entity,
    EvidenceKind,
    FaultClass,
    Finding,
)
from aiops.identity import INGRESS_SERVICE
from aiops.store import Store

__all__ = ["TraceThresholds", "trace_findings"]

NS = 1_000_000_000
INGRESS = INGRESS_SERVICE


@dataclass(frozen=True)
class TraceThresholds:
    window_s: float = 20.0
    baseline_s: float = 600.0
    min_spans: int = 5
    latency_ratio: float = 1.5  # the median must also grow by this factor
    robust_z: float = 4.0  # ...and by this many scaled MADs
    error_share: float = 0.2  # failed share that can fire at all
    error_increase: float = 0.1  # over the baseline's failed share
    # The tail test: the baseline needs this many spans, and the window at least ``tail_min``
    # spans beyond its 99th percentile, at binomial odds below tail_alpha. Each span is taken
    # to pass that level with probability max(1 - tail_quantile, 1 / (n + 1)), n the
    # baseline's spans: a new draw beats the largest of n with odds 1 / (n + 1), so a short
    # baseline cannot claim more certainty than it has.
    tail_baseline: int = 30
    # ...and those spans at least this many times the baseline's median: queueing bursts make
    # a few requests of a busy model 2-3x slower together (not independent draws, which the
    # binomial odds assume); a broken version is slower than that.
    tail_ratio: float = 3.0
    # ...and at least this much slower than the baseline's median. Not a figure fitted to any
    # trace: CPU scheduling alone delays a runnable thread by a scheduler period (CFS: 6 ms x
    # (1 + log2 cores), 12 ms on 2 cores) each time it is preempted, so on a busy node a
    # request of a few ms can take two periods longer with nothing wrong (the soak of the
    # attached composed app, docs/benchmarks.md: a 5 ms handle call, 7 of 152 spans over 15 ms,
    # median unchanged).
    tail_min_excess_ms: float = 25.0
    tail_quantile: float = 0.99
    tail_min: int = 2
    tail_alpha: float = 1e-3
    # ...and it judges windows of fewer spans than this (a canary's first requests); with as
    # many, the shift test has the power and the tail's odds mislead: they take the spans as
    # independent draws, and a busy node's bursts slow many at once (the attach soak on a
    # noisy 2-core machine, docs/benchmarks.md: 8 of 178 spans over the level in a burst,
    # the median unmoved, paged after a good release). A regression of only the slowest
    # few percent of many requests is for an SLO to catch (its burn rate).
    tail_max_spans: int = 30
    # The model's SLO latency as a floor for both tests (where it has an SLO; see below).
    slo_floor: bool = True
    # Open requests: reports this recent count (replicas report every export interval, 1 s by
    # default); one whose estimated start is this close to a span's start is that span.
    in_flight_fresh_s: float = 2.5
    in_flight_same_s: float = 0.25
    # A version first served within the last change_horizon_s, after another version of its
    # service, is a change (a release, a canary): its findings are tied to that change. A bad
    # release shows itself in its first requests (seconds to a minute at low traffic); later,
    # a version is judged as any other (pages only where an SLO burns), so the minutes after
    # a good release on a noisy machine are not a window for false pages. The margin keeps a
    # lookback that merely begins with the traffic (a server just started) from calling
    # every version new.
    change_horizon_s: float = 180.0
    change_margin_s: float = 60.0


# Groups: ingress spans are one group per operation (the caller); model spans one per
# operation and version (the callees, where a version's own trouble shows).
_GROUPS = f"""
WITH s AS (
  SELECT service_name AS service, name,
         CASE WHEN service_name = ? THEN NULL ELSE {semconv.VERSION} END
             AS version, {semconv.MODEL} AS model, duration_ns, {semconv.FAILED} AS failed,
         trace_id, epoch_ns(end_time) >= ? AS current, start_time, end_time
  FROM spans
  -- By end time: a span is evidence from when it is known (a 5 s request that started before
  -- the window but just ended is news), and the window holds what ended in it.
  WHERE end_time > make_timestamp_ns(?) AND end_time <= make_timestamp_ns(?)
    AND service_name IS NOT NULL AND duration_ns IS NOT NULL AND {NOT_WARMUP}
)
SELECT service, name, version, model, current,
       count(*) AS n, median(duration_ns) AS med, mad(duration_ns) AS mad,
       avg(failed::INTEGER) AS failed_share,
       arg_max(trace_id, duration_ns) AS slowest,
       arg_max(trace_id, failed::INTEGER * 1e18 + duration_ns) AS failed_trace,
       quantile_cont(duration_ns, 0.99) AS p99,
       -- the window's own spans, slowest first (few: the window is seconds long)
       list(duration_ns ORDER BY duration_ns DESC) FILTER (WHERE current) AS durations,
       -- their end times, in the same order (when each slow span was last seen)
       list(epoch_ns(end_time) ORDER BY duration_ns DESC) FILTER (WHERE current) AS ends,
       count(*) FILTER (WHERE failed) AS n_failed,
       max(epoch_ns(end_time)) FILTER (WHERE failed) AS last_failed_ns,
       min(epoch_ns(start_time)) AS first_ns
FROM s GROUP BY ALL
"""


# Requests still open: each rank's latest report, as (group, age, when reported).
_IN_FLIGHT = f"""
WITH p AS (
  SELECT service_name AS service,
         (attributes->>'{semconv.OPERATION_ATTR}') || ' '
             || {semconv.MODEL} AS name,
         {semconv.VERSION} AS version, {semconv.MODEL} AS model,
         (attributes->>'{semconv.IN_FLIGHT_RANK_ATTR}') AS rank, value, time
  FROM metric_points
  WHERE name = '{semconv.IN_FLIGHT_AGE_METRIC}' AND service_name IS NOT NULL
    AND time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?)
)
SELECT service, name, version, model, arg_max(value, time) AS age_s,
       max(epoch_ns(time)) AS at_ns
FROM p GROUP BY service, name, version, model, rank
"""

# The in-place configs a version ran with (aiops' replicas stamp each span with theirs).
_CONFIGS = f"""
SELECT (attributes->>'{semconv.CONFIG_DIGEST_ATTR}') AS config,
       min(epoch_ns(start_time)) AS first_ns, max(epoch_ns(start_time)) AS last_ns
FROM spans
WHERE service_name = ? AND {semconv.VERSION} = ?
  AND end_time > make_timestamp_ns(?) AND end_time <= make_timestamp_ns(?)
  AND (attributes->>'{semconv.CONFIG_DIGEST_ATTR}') IS NOT NULL
GROUP BY ALL
"""

# (service, span name, version, model served)
_Key = tuple[str, str, str | None, str | None]


@dataclass
class _Stats:
    n: int
    med: float
    mad: float
    failed: float
    slowest: str
    failed_trace: str
    p99: float = 0.0
    durations: tuple[float, ...] = ()
    n_failed: int = 0
    ends: tuple[int, ...] = ()  # the end of each of ``durations``' spans
    last_failed_ns: int | None = None

    def last_slower(self, level: float) -> int | None:
        """When the latest of the window's spans slower than ``level`` ended."""
        return max((e for d, e in zip(self.durations, self.ends, strict=False) if d > level),
                   default=None)


def _tail_odds(k: int, n: int, p: float) -> float:
    """P(at least k of n spans are beyond a level the baseline passes with probability p)."""
    return float(stats.binom.sf(k - 1, n, p))


def _baseline(own: _Stats | None, siblings: list[_Stats], min_spans: int) -> _Stats | None:
    if own is not None and own.n >= min_spans:
        return own
    pool = [s for s in siblings if s.n >= min_spans]
    if not pool:
        return None
    # The sibling with the most spans is the stable version in a canary rollout.
    return max(pool, key=lambda s: s.n)


def trace_findings(store: Store, now_ns: int, t: TraceThresholds | None = None,
                   slow_ms: Mapping[str, float] | None = None) -> list[Finding]:
    """Latency and error findings of the window's spans against their baseline. ``slow_ms``:
    per model, the latency its SLO calls slow. Where a model has one, a latency finding also
    needs its slow spans (the window's median, or the tail's spans) beyond it: on a busy
    node a neighbour's burst (an OCR request taking both cores) makes a chat model 2-3x
    slower for seconds, a real shift but one its users' objective says is fine; those are
    not incidents."""
    t = t or TraceThresholds()
    slow_ms = (slow_ms or {}) if t.slo_floor else {}
    cur_start = now_ns - int(t.window_s * NS)
    rows = store.query(_GROUPS, [INGRESS, cur_start, now_ns - int(t.baseline_s * NS),
                                 now_ns]).rows
    current: dict[_Key, _Stats] = {}
    history: dict[_Key, _Stats] = {}
    first: dict[tuple[str, str | None], int] = {}  # (service, version) -> its first span
    for (service, name, version, model, is_current, n, med, mad, failed, slowest, ftrace, p99,
         durations, ends, n_failed, last_failed_ns, first_ns) in rows:
        first[(service, version)] = min(int(first_ns), first.get((service, version), 1 << 62))
        group = _Stats(int(n), float(med), float(mad or 0), float(failed or 0), slowest, ftrace,
                       float(p99 or 0), tuple(float(d) for d in durations or ()),
                       int(n_failed or 0), tuple(int(e) for e in ends or ()),
                       None if last_failed_ns is None else int(last_failed_ns))
        (current if is_current else history)[(service, name, version, model)] = group
    _add_in_flight(store, now_ns, t, current, first)
    changes = _changes(first, max(now_ns - int(t.baseline_s * NS) + int(t.change_margin_s * NS),
                                  now_ns - int(t.change_horizon_s * NS)), now_ns)
    config_changes: dict[tuple[str, str], str | None] = {}
    found: list[Finding] = []
    for key, cur in current.items():
        service, name, version, model = key
        if cur.n < min(t.min_spans, t.tail_min):
            continue
        # A sibling's history where it has one (the longer record), else its window.
        siblings = [s for (sv, nm, v, m), s in {**current, **history}.items()
                    if sv == service and nm == name and m == model and v != version]
        # The tail tests need a longer baseline: a canary's own few gate requests are not one.
        # They are for model versions: the ingress mixes every version's requests (and its
        # router's queueing), so a version's own spans say more, and sooner, than its tail.
        base = _baseline(history.get(key), siblings, t.min_spans)
        tail = None if service == INGRESS else \
            _baseline(history.get(key), siblings, t.tail_baseline)
        if base is None:
            continue
        entity, about = Entity(service, version), model if service == INGRESS else None
        floor_ns = 0.0 if _sibling_unshifted(key, current, history, t) else \
            slow_ms.get(model or service, 0.0) * 1e6
        mine = _latency(entity, name, about, cur, base, tail, t, cur_start, now_ns, floor_ns)
        # Hidden by the floor only: shown where a change is behind it (below) and no other
        # version serves beside it now (a canary's sibling says whether contention slows
        # the node: _sibling_unshifted); a release that replaced its predecessor has none.
        alone = not any(s.n >= t.min_spans for (sv, nm, v, m), s in current.items()
                        if sv == service and nm == name and m == model and v != version)
        floored = [] if mine or not floor_ns or not alone else \
            _latency(entity, name, about, cur, base, tail, t, cur_start, now_ns, 0.0)
        # Errors against the best the model did recently: a release failing from its first
        # request has a history of failing too, and a baseline of it would absorb the fault
        # (an open incident resolving while the release still fails a third of its calls).
        err_base = min((s for s in (base, *siblings) if s.n >= t.min_spans),
                       key=lambda s: s.failed)
        mine += _errors(entity, name, about, cur, err_base, tail, t, cur_start, now_ns)
        change = changes.get((service, version))
        if (mine or floored) and change is None and version is not None \
                and service != INGRESS:
            if (service, version) not in config_changes:  # asked only where something fires
                config_changes[(service, version)] = _config_change(
                    store, service, version, now_ns, t)
            change = config_changes[(service, version)]
        if change:
            # The SLO floor is for contention; a regression that came with a change is the
            # change's doing (a release 20x slower, still inside a generous objective).
            found += [replace(f, change=change) for f in mine + floored]
        else:
            found += mine
    return found


def _config_change(store: Store, service: str, version: str, now_ns: int,
                   t: TraceThresholds) -> str | None:
    """A change of the version's in-place config (a user_config release under the same
    version) in the last ``change_horizon_s``, after another config it served with."""
    since = now_ns - int(t.baseline_s * NS)
    rows = store.query(_CONFIGS, [service, version, since, now_ns]).rows
    if len(rows) < 2:
        return None
    config, first_ns, _ = max(rows, key=lambda r: int(r[2]))  # the one it runs now
    recent = int(first_ns) > max(since + int(t.change_margin_s * NS),
                                 now_ns - int(t.change_horizon_s * NS))
    if not recent or not any(int(r[1]) < int(first_ns) for r in rows if r[0] != config):
        return None
    return (f"{service}@{version} config changed in place {(now_ns - int(first_ns)) / NS:.0f} "
            f"s ago (to {config})")


def _add_in_flight(store: Store, now_ns: int, t: TraceThresholds,
                   current: dict[_Key, _Stats], first: dict[tuple[str, str | None], int]
                   ) -> None:
    """Requests still open, as spans of their age that end now, into ``current`` (and the
    version's first request into ``first``)."""
    rows = store.query(_IN_FLIGHT, [now_ns - int(t.in_flight_fresh_s * NS), now_ns]).rows
    open_: dict[_Key, list[float]] = {}
    for service, name, version, model, age_s, at_ns in rows:
        if name is None or age_s is None:
            continue
        key = (service, name, version, model)
        started = int(at_ns) - int(float(age_s) * NS)
        cur = current.get(key)
        if cur is not None and any(
                abs((e - d) - started) < t.in_flight_same_s * NS
                for d, e in zip(cur.durations, cur.ends, strict=False)):
            continue  # it has ended since: its span is counted
        open_.setdefault(key, []).append((now_ns - started) / 1.0)
        first[(service, version)] = min(started, first.get((service, version), 1 << 62))
    for key, ages in open_.items():
        cur = current.get(key)
        pairs = sorted([*zip(cur.durations, cur.ends, strict=False)] if cur else [], reverse=True)
        pairs = sorted([*pairs, *((a, now_ns) for a in ages)], reverse=True)
        durations = tuple(d for d, _ in pairs)
        if cur is None:
            mid = sorted(durations)[len(durations) // 2]
            current[key] = _Stats(len(durations), mid, 0.0, 0.0, "", "", durations[0],
                                  durations, 0, tuple(e for _, e in pairs))
        else:
            current[key] = replace(cur, n=cur.n + len(ages), durations=durations,
                                   ends=tuple(e for _, e in pairs))


def _changes(first: dict[tuple[str, str | None], int], new_after_ns: int, now_ns: int
             ) -> dict[tuple[str, str | None], str]:
    """Versions that are a recent change: first served after ``new_after_ns``, with another
    version of the same service served before them (what they replaced, or run beside)."""
    out: dict[tuple[str, str | None], str] = {}
    for (service, version), first_ns in first.items():
        if version is None or first_ns <= new_after_ns:
            continue
        before = sorted((f, v) for (s, v), f in first.items()
                        if s == service and v is not None and v != version and f < first_ns)
        if before:
            out[(service, version)] = (
                f"{service}@{version} first served {(now_ns - first_ns) / NS:.0f} s ago, "
                f"after {before[-1][1]}")
    return out


def _sibling_unshifted(key: _Key, current: dict[_Key, _Stats], history: dict[_Key, _Stats],
                       t: TraceThresholds) -> bool:
    """Whether another version of this model serves at its usual speed in the same window.
    The SLO floor is there for contention, and contention slows every version on the node at
    once: a version slower than a sibling that is not slowed is the version's own doing (a
    canary 14x slower than its stable version is a regression before it breaches the SLO)."""
    service, name, version, model = key
    if service == INGRESS or version is None:
        return False
    for (sv, nm, v, m), cur in current.items():
        if sv != service or nm != name or m != model or v == version or cur.n < t.min_spans:
            continue
        own = history.get((sv, nm, v, m))
        if own is not None and own.n >= t.min_spans and cur.med <= t.latency_ratio * own.med:
            return True
    return False


def _scale(base: _Stats) -> float:
    return max(1.4826 * base.mad, 0.1 * base.med, 1e6)  # at least 1 ms


def _latency(entity: Entity, name: str, about: str | None, cur: _Stats, base: _Stats,
             tail: _Stats | None, t: TraceThresholds, start_ns: int, now_ns: int,
             floor_ns: float = 0.0) -> list[Finding]:
    scale = _scale(base)
    z = (cur.med - base.med) / scale
    if cur.n >= t.min_spans and cur.med > t.latency_ratio * base.med and z > t.robust_z \
            and cur.med > floor_ns:
        score, how = z / t.robust_z, f"median {cur.med / 1e6:.0f} ms over {cur.n} spans"
        last_ns = cur.last_slower(t.latency_ratio * base.med)
    elif tail is not None and cur.n < t.tail_max_spans:
        base, scale = tail, _scale(tail)
        level = max(base.p99, t.tail_ratio * base.med, base.med + t.robust_z * scale,
                    base.med + t.tail_min_excess_ms * 1e6, floor_ns)
        beyond = [d for d in cur.durations if d > level]
        p = max(1 - t.tail_quantile, 1 / (base.n + 1))
        odds = _tail_odds(len(beyond), cur.n, p)
        if len(beyond) < t.tail_min or odds >= t.tail_alpha:
            return []
        z = (beyond[len(beyond) // 2] - base.med) / scale
        # On the shift test's scale (how far the slow spans are), so that a version found by
        # its tail ranks beside one found by its median; at least the odds' own strength.
        score = max(z / t.robust_z, math.log(odds) / math.log(t.tail_alpha))
        how = (f"{len(beyond)} of {cur.n} spans slower than {level / 1e6:.0f} ms (the "
               f"baseline's p99 {base.p99 / 1e6:.0f} ms; odds {odds:.0e})")
        last_ns = cur.last_slower(level)
    else:
        return []
    return [Finding(
        "trace_latency", entity, FaultClass.LATENCY, score, start_ns, now_ns,
        f"{entity} '{name}': {how} vs a median of {base.med / 1e6:.0f} ms normally "
        f"({cur.med / base.med:.1f}x)",
        [e for e in (
            # (no trace yet where the slow requests are all still open)
            entity.evidence(EvidenceKind.TRACE, cur.slowest, FaultClass.LATENCY,
                            f"slowest '{name}' now", cur.med / 1e6, base.med / 1e6, z),
            entity.evidence(EvidenceKind.TRACE, base.slowest, FaultClass.LATENCY,
                            f"slowest '{name}' in the baseline"),
            entity.evidence(EvidenceKind.METRIC, f"span.duration.median{{{name}}}",
                            FaultClass.LATENCY, "median_ms", cur.med / 1e6, base.med / 1e6, z))
         if e.id],
        about, last_ns=last_ns)]


def _errors(entity: Entity, name: str, about: str | None, cur: _Stats, base: _Stats,
            tail: _Stats | None, t: TraceThresholds, start_ns: int, now_ns: int
            ) -> list[Finding]:
    if cur.n < t.min_spans:
        if tail is None:
            return []
        # Few spans: the failures must be unlikely at the baseline's failed share (with one
        # failure added, so a baseline that never failed still gives finite odds).
        base = tail
        odds = _tail_odds(cur.n_failed, cur.n, (base.n_failed + 1) / (base.n + 2))
        if cur.n_failed < t.tail_min or odds >= t.tail_alpha:
            return []
    if cur.failed < t.error_share or cur.failed <= base.failed + t.error_increase:
        return []
    score = (cur.failed - base.failed) / t.error_increase
    return [Finding(
        "trace_errors", entity, FaultClass.ERRORS, score, start_ns, now_ns,
        f"{entity} '{name}': {cur.failed:.0%} of {cur.n} spans failed vs "
        f"{base.failed:.0%} normally",
        [entity.evidence(EvidenceKind.TRACE, cur.failed_trace, FaultClass.ERRORS,
                         f"a failed '{name}' span"),
         entity.evidence(EvidenceKind.METRIC, f"span.failed_share{{{name}}}",
                         FaultClass.ERRORS, "failed_share", cur.failed, base.failed, score)],
        about, last_ns=cur.last_failed_ns)]

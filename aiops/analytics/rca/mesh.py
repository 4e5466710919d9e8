"""Mesh-edge evidence: per-edge latency gauges reported by both ends of a call (Istio's
labels), for stacks without traces."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig
from aiops.analytics.rca.scope import MINUTE_NS, Db, Scope

_EdgeMinutes = dict[tuple[str, str], dict[int, set[int]]]  # edge -> phase -> minutes


def mesh_evidence(db: Db, scope: Scope, cfg: RankConfig) -> list[Evidence]:
    """Evidence from per-edge latency gauges that both ends of a call report (see the module
    docstring); one point per edge, reporter and minute."""
    rows = db.rows(f"""
        WITH p AS (
            SELECT name, (attributes->>'source_workload') AS src,
                   (attributes->>'destination_workload') AS dst,
                   (attributes->>'reporter') AS reporter,
                   value * CASE WHEN unit = 's' THEN 1000 ELSE 1 END AS ms,
                   {scope.phase('time')} AS phase, epoch_ns(time) // {MINUTE_NS} AS minute
            FROM metric_points
            WHERE {scope.bounds('time')} AND type = 'gauge'
              AND (attributes->>'reporter') IN ('source', 'destination')
        )
        SELECT name, src, dst, phase, minute,
               max(ms) FILTER (WHERE reporter = 'source'),
               max(ms) FILTER (WHERE reporter = 'destination')
        FROM p WHERE phase IS NOT NULL AND src IS NOT NULL AND dst IS NOT NULL
        GROUP BY ALL""")
    by_name: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:  # a p50 and a p99 gauge of the same edges are two separate signals
        by_name[str(row[0])].append(row[1:])
    out: list[Evidence] = []
    for name, series in sorted(by_name.items()):
        minutes: dict[int, set[int]] = {0: set(), 1: set()}
        seen: _EdgeMinutes = defaultdict(lambda: {0: set(), 1: set()})
        alive: dict[str, dict[int, set[int]]] = defaultdict(lambda: {0: set(), 1: set()})
        gap: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(
            lambda: {0: [], 1: []})
        for src, dst, phase, minute, by_src, by_dst in series:
            edge, ph, m = (str(src), str(dst)), int(phase), int(minute)
            minutes[ph].add(m)
            seen[edge][ph].add(m)
            # A workload is up in a minute its own end of some edge reported.
            if by_src is not None:
                alive[edge[0]][ph].add(m)
            if by_dst is not None:
                alive[edge[1]][ph].add(m)
            if by_src is not None and by_dst is not None:
                gap[edge][ph].append(float(by_src) - float(by_dst))
        out += _mesh_network(name, gap, cfg)
        out += _mesh_vanished(name, seen, alive, minutes, cfg)
    return out


def _mesh_network(name: str, gap: Mapping[tuple[str, str], Mapping[int, list[float]]],
                  cfg: RankConfig) -> list[Evidence]:
    """The caller's view beyond the callee's, the anomaly window's median against the
    baseline's, in baseline spreads floored as span times are; charged to the callee unless
    one caller is slow towards several callees that nobody else is slow towards."""
    slow = []
    for (src, dst), by in gap.items():
        b, a = by[0], by[1]
        if len(b) < cfg.min_points or len(a) < cfg.min_points:
            continue
        # numpy's default (linear) quantiles are DuckDB's quantile_cont, as in the SQL paths.
        q05, q25, med, q75, q95 = (float(x) for x in np.quantile(b, [.05, .25, .5, .75, .95]))
        level = float(np.median(a))
        spread = max(q75 - q25, (q95 - q05) / 4, cfg.rel_floor * abs(med), cfg.ms_floor)
        if (z := (level - med) / spread) >= cfg.threshold:
            slow.append((src, dst, level, med, z))
    callees_of: dict[str, set[str]] = defaultdict(set)
    callers_of: dict[str, set[str]] = defaultdict(set)
    for src, dst, *_ in slow:
        callees_of[src].add(dst)
        callers_of[dst].add(src)
    return [Evidence(EvidenceKind.METRIC, f"{name}{{{src}->{dst}}}",
                     src if len(callees_of[src]) > 1 and len(callers_of[dst]) == 1 else dst,
                     FaultClass.NETWORK, "mesh:network", level, med, z)
            for src, dst, level, med, z in slow]


def _mesh_vanished(name: str, seen: _EdgeMinutes,
                   alive: Mapping[str, Mapping[int, set[int]]], minutes: Mapping[int, set[int]],
                   cfg: RankConfig) -> list[Evidence]:
    """Edges missing from at least half of the anomaly window's minutes while their caller
    is up then (its own end of some other edge reports), against the share of baseline
    minutes they were there in (a binomial z, shrunk off 0 and 1 by half a count): the
    caller stopped making the call -- an exception or early return before it -- so the
    caller is charged, errors. A caller that is down is not charged here."""
    na, nb = len(minutes[1]), len(minutes[0])
    if na == 0 or nb < cfg.min_execs:
        return []
    out = []
    for (src, dst), by in seen.items():
        missing = minutes[1] - by[1]
        if 2 * len(missing) < na or not missing <= alive.get(src, {}).get(1, set()):
            continue
        rate, now = len(by[0]) / nb, len(by[1]) / na
        p = (rate * nb + 0.5) / (nb + 1.0)
        z = (rate - now) / math.sqrt(p * (1 - p) * (1 / na + 1 / nb))
        if z >= cfg.threshold:
            out.append(Evidence(EvidenceKind.METRIC, f"{name}{{{src}->{dst}}}", src,
                                FaultClass.ERRORS, "mesh:calls", now, rate, z))
    return out

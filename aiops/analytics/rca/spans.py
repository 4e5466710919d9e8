"""Span evidence: exclusive time per operation, the network share of client spans, call
structure and errors per execution, and callees that stopped answering."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb

from aiops import semconv
from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig
from aiops.analytics.rca.rates import Counts
from aiops.analytics.rca.scope import END, Db, Scope, lit


@contextmanager
def span_facts(db: Db, scope: Scope, cfg: RankConfig) -> Iterator[_SpanFacts]:
    facts = _SpanFacts(db, scope, cfg)
    try:
        yield facts
    finally:
        facts.close()


class _SpanFacts:
    """Per-span facts of both phases, read from the store once and then aggregated in a
    private in-memory DuckDB (each question below is one more pass over them)."""

    def __init__(self, db: Db, scope: Scope, cfg: RankConfig) -> None:
        self.cfg = cfg
        # Per span: its exclusive time (duration less its children's), the one remote
        # entity it called when all its children are elsewhere (a client span), and whether
        # an error under it started deeper down. "Failed" as everywhere (aiops.semconv):
        # an error status or an HTTP 5xx.
        facts = db.arrow(f"""
            WITH s AS (
                SELECT trace_id, span_id, parent_span_id, name AS op,
                       coalesce({scope.entity}, '') AS ent,
                       coalesce(duration_ns, epoch_ns(end_time) - epoch_ns(start_time))
                           / 1e6 AS ms,
                       coalesce({semconv.FAILED}, false) AS err,
                       {scope.phase('start_time')} AS phase,
                       {scope.bucket('start_time')} AS bucket, epoch_ns(start_time) AS t,
                       coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns)
                           AS t_end,
                       {scope.piece('start_time')} AS piece
                FROM spans WHERE {scope.bounds('start_time')}
            ), sp AS (
                -- A span that ends after the last span collected in its window may have
                -- children nobody collected: its call sequence is not complete.
                SELECT *, t_end <= max(t) OVER (PARTITION BY piece) AS complete
                FROM s WHERE phase IS NOT NULL
            ),
            k AS (
                SELECT p.trace_id, p.span_id, sum(c.ms) AS child_ms,
                       count(*) FILTER (WHERE c.ent = p.ent) AS local_children,
                       min(c.ent) FILTER (WHERE c.ent <> p.ent) AS remote,
                       count(DISTINCT c.ent) FILTER (WHERE c.ent <> p.ent) AS remotes,
                       bool_or(c.err) AS child_err, count(*) AS children
                FROM sp p JOIN sp c ON c.trace_id = p.trace_id
                    AND c.parent_span_id = p.span_id AND c.phase = p.phase
                GROUP BY p.trace_id, p.span_id
            )
            SELECT sp.trace_id, sp.span_id, sp.parent_span_id, sp.op, sp.ent, sp.err,
                   sp.phase, sp.bucket, sp.t, sp.complete,
                   greatest(sp.ms - coalesce(k.child_ms, 0), 0) AS excl,
                   CASE WHEN k.remotes = 1 AND k.local_children = 0 THEN k.remote END
                       AS callee,
                   coalesce(k.child_err, false) AS child_err,
                   coalesce(k.children, 0) AS children
            FROM sp LEFT JOIN k USING (trace_id, span_id)""")
        self.local = duckdb.connect()
        self.local.execute("SET enable_progress_bar = false")
        self.local.register("f", facts)

    def close(self) -> None:
        self.local.close()

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.local.execute(sql).fetchall()

    def _shifts(self, key: str, where: str) -> list[tuple[Any, ...]]:
        """Per ``key``: anomaly median of exclusive time, baseline median, an example trace
        and the shift in baseline spreads (IQR, floored)."""
        cfg = self.cfg
        return self._rows(f"""
            WITH d AS (SELECT {key}, excl, phase, trace_id FROM f WHERE {where}),
            b AS (SELECT {key}, median(excl) AS med,
                         greatest(quantile_cont(excl, 0.75) - quantile_cont(excl, 0.25),
                                  {cfg.rel_floor} * median(excl), {cfg.ms_floor}) AS spread
                  FROM d WHERE phase = 0 GROUP BY ALL HAVING count(*) >= {cfg.min_spans}),
            a AS (SELECT {key}, median(excl) AS amed, arg_max(trace_id, excl) AS example
                  FROM d WHERE phase = 1 GROUP BY ALL HAVING count(*) >= {cfg.min_points})
            SELECT {key}, amed, med, example, (amed - med) / spread AS z
            FROM a JOIN b USING ({key}) WHERE (amed - med) / spread >= {cfg.threshold}""")

    def latency_evidence(self) -> list[Evidence]:
        """Exclusive time of the spans an entity runs itself (not waiting on a callee)."""
        return [Evidence(EvidenceKind.TRACE, str(example), str(ent), FaultClass.LATENCY,
                         f"exclusive_ms:{op}", float(amed), float(med), float(z))
                for ent, op, amed, med, example, z in self._shifts("ent, op",
                                                                   "callee IS NULL")]

    def network_evidence(self, slow_itself: set[str]) -> list[Evidence]:
        """Client-span time not covered by the callee's server span: network or queueing,
        charged to the callee -- unless one caller is slow towards several callees that
        nobody else is slow towards, or is slow itself while the callee is not."""
        edges = self._shifts("ent, callee, op", "callee IS NOT NULL")
        callees_of: dict[str, set[str]] = defaultdict(set)
        callers_of: dict[str, set[str]] = defaultdict(set)
        for caller, callee, *_ in edges:
            callees_of[str(caller)].add(str(callee))
            callers_of[str(callee)].add(str(caller))
        out = []
        for caller, callee, op, amed, med, example, z in edges:
            caller, callee = str(caller), str(callee)
            fan_out = len(callees_of[caller]) > 1 and len(callers_of[callee]) == 1
            own = caller in slow_itself and callee not in slow_itself
            blame = caller if fan_out or own else callee
            out.append(Evidence(EvidenceKind.TRACE, str(example), blame, FaultClass.NETWORK,
                                f"network_ms:{caller}->{callee}:{op}", float(amed),
                                float(med), float(z)))
        return out

    def structure_evidence(self) -> list[Evidence]:
        """The calls one execution of an operation makes, in order: which call follows
        which (the first follows the operation's start, the last is followed by its end),
        and how often an error starts in it (not under it), against the baseline. A code
        path that returns early or throws stops making the calls after that point."""
        counts = Counts()
        op_of: dict[tuple[str, str], str] = {}
        for ent, op, a, b, bucket, n, example in self._rows(f"""
                WITH c AS (
                    SELECT p.ent, p.op, p.trace_id, p.span_id, p.bucket, c.t,
                           c.ent || ' ' || c.op AS ev
                    FROM f p JOIN f c ON c.trace_id = p.trace_id
                        AND c.parent_span_id = p.span_id AND c.phase = p.phase
                    WHERE p.complete
                ), seq AS (
                    SELECT ent, op, trace_id, bucket, ev AS b,
                           coalesce(op || ': ' || lag(ev) OVER w, '<start of ' || op || '>')
                               AS a,
                           op || ': ' || ev AS b_head, lead(ev) OVER w IS NULL AS last
                    FROM c WINDOW w AS (PARTITION BY trace_id, span_id ORDER BY t, ev)
                )
                SELECT ent, op, a, b, bucket, count(*), max(trace_id) FROM seq GROUP BY ALL
                UNION ALL
                SELECT ent, op, b_head, {lit(END)}, bucket, count(*), max(trace_id) FROM seq
                WHERE last GROUP BY ALL
                UNION ALL
                SELECT ent, op, '<errors of ' || op || '>', 'error', bucket, count(*),
                       max(trace_id)
                FROM f WHERE err AND NOT child_err GROUP BY ALL"""):
            counts.add(str(ent), str(a), str(b), int(bucket), int(n), str(example))
            op_of[(str(ent), str(a))] = str(op)
        execs = {(str(e), str(o), int(b)): int(n) for e, o, b, n in self._rows(
            "SELECT ent, op, bucket, count(*) FROM f WHERE complete GROUP BY ALL")}
        counts.count_silent_executions(execs)
        for (ent, op, bucket), n in execs.items():
            counts.heads[(ent, f"<errors of {op}>")][bucket] = n
        out = []
        for (ent, a, b), z, observed, rate in counts.scored(self.cfg):
            example = counts.example.get((ent, a, b)) or self._example(ent, op_of[(ent, a)])
            kind = "errors" if b == "error" else "calls"
            out.append(Evidence(EvidenceKind.TRACE, example, ent, FaultClass.ERRORS,
                                f"{kind}:{a} -> {b}", observed, rate, z))
        return out

    def _example(self, ent: str, op: str) -> str:
        """A trace of the anomaly window in which ``ent`` ran ``op``."""
        rows = self._rows(f"SELECT max(trace_id) FROM f WHERE phase = 1 AND ent = {lit(ent)} "
                          f"AND op = {lit(op)}")
        return str(rows[0][0]) if rows and rows[0][0] is not None else ""

    def crash_evidence(self) -> list[Evidence]:
        """A callee that no longer answers: the client spans that used to reach it (their
        server span their child) go on, but as many more of them end childless as it
        should have answered, and it answered (next to) none."""
        cfg = self.cfg
        rows = self._rows(f"""
            WITH done AS (SELECT * FROM f WHERE complete),
            counted AS (
                SELECT ent, op, coalesce(callee, '') AS callee, count(*) AS n
                FROM done WHERE phase = 0 AND (callee IS NOT NULL OR children = 0)
                GROUP BY ALL
            ), base AS (
                -- Per client operation: which share of its calls reached which callee, and
                -- which share got no answer at all (callee '').
                SELECT ent, op, callee, n / sum(n) OVER (PARTITION BY ent, op) AS share
                FROM counted
            ), client_ops AS (SELECT DISTINCT ent, op FROM base WHERE callee <> ''),
            anom AS (
                SELECT ent, op, count(*) AS n,
                       count(*) FILTER (WHERE children = 0) AS unanswered,
                       max(trace_id) FILTER (WHERE children = 0) AS example
                FROM done JOIN client_ops USING (ent, op) WHERE phase = 1 GROUP BY ALL
            ), answered AS (
                SELECT ent, op, callee, count(*) AS c FROM done
                WHERE phase = 1 AND callee IS NOT NULL GROUP BY ALL
            ), per_op AS (
                SELECT b.callee, b.share * a.n AS expected, coalesce(ans.c, 0) AS answered,
                       a.unanswered - coalesce(nb.share, 0) * a.n AS extra_unanswered,
                       a.example
                FROM base b JOIN anom a USING (ent, op)
                LEFT JOIN answered ans USING (ent, op, callee)
                LEFT JOIN base nb ON nb.ent = b.ent AND nb.op = b.op AND nb.callee = ''
                WHERE b.callee <> ''
            )
            SELECT callee, sum(expected), sum(answered), sum(extra_unanswered), max(example)
            FROM per_op GROUP BY callee
            HAVING sum(expected) >= {cfg.min_execs}
               AND sum(answered) < 0.05 * sum(expected)
               AND sum(extra_unanswered) >= 0.5 * sum(expected)""")
        # The score: calls it should have answered against the Poisson noise of the ones it
        # did answer.
        return [Evidence(EvidenceKind.TRACE, str(example), str(callee), FaultClass.CRASH,
                         "silence:spans", float(answered), float(expected),
                         (expected - answered) / math.sqrt(answered + 1))
                for callee, expected, answered, _, example in rows]

    def call_edges(self) -> set[tuple[str, str]]:
        """Caller -> callee entity pairs seen in either window."""
        rows = self._rows("SELECT DISTINCT ent, callee FROM f WHERE callee IS NOT NULL")
        return {(str(a), str(b)) for a, b in rows}

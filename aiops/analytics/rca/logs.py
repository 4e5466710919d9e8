"""Log evidence: drain3 templates of masked bodies, transitions between templates within one
span, and entities whose share of the log records fell to nothing."""

from __future__ import annotations

import math
from collections import defaultdict

from aiops.analytics.rca.model import Evidence, EvidenceKind, FaultClass, RankConfig
from aiops.analytics.rca.rates import Counts
from aiops.analytics.rca.scope import ANOM, END, Db, Scope, lit

# Masks applied before template mining (RE2, in DuckDB): ids and numbers, but not numbers
# glued to an identifier (a logger's "Class#123" line number tells statements apart).
_MASKS = (
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<UUID>"),
    (r"\b[0-9a-fA-F]{16,}\b", "<HEX>"),
    (r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b", "<IP>"),
    (r"(^|[^#\w.])[-+]?\d+(\.\d+)?\b", r"\1<NUM>"),
)


def mask_sql(column: str) -> str:
    """SQL that masks ``column`` for template mining."""
    expr = column
    for pattern, token in _MASKS:
        expr = f"regexp_replace({expr}, {lit(pattern)}, {lit(token)}, 'g')"
    return expr


def log_evidence(db: Db, scope: Scope, cfg: RankConfig) -> list[Evidence]:
    """Which template follows which in the records one span writes, and which one an
    operation's execution starts with (or ends without any), against the baseline.

    An early return shows as a pair that breaks (A no longer followed by B) or an operation
    that stops logging; an exception as a pair that breaks and a new one (A followed by an
    error). Conditioning on A (on the operation) makes load and request mix cancel out.
    """
    rows = db.rows(f"""
        WITH l AS (
            SELECT {scope.entity} AS ent, coalesce(trace_id, '') AS trace_id,
                   coalesce(span_id, '') AS span_id, epoch_ns(time) AS t,
                   {mask_sql('body')} AS body, coalesce(severity_number, 0) AS sev,
                   {scope.phase('time')} AS phase, {scope.bucket('time')} AS bucket
            FROM logs WHERE {scope.bounds('time')} AND body IS NOT NULL
        ), s0 AS (
            SELECT trace_id, span_id, name, epoch_ns(start_time) AS t,
                   coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns) AS t_end,
                   {scope.piece('start_time')} AS piece
            FROM spans WHERE {scope.bounds('start_time')}
        ), s AS (
            -- Records of a span that outlived the data collected in its window are cut off.
            SELECT trace_id, span_id, any_value(name) AS op,
                   bool_and(t_end <= horizon) AS complete
            FROM (SELECT *, max(t) OVER (PARTITION BY piece) AS horizon FROM s0
                  WHERE piece IS NOT NULL)
            GROUP BY ALL
        )
        SELECT l.ent, l.trace_id, l.span_id, s.op, l.body, l.sev, l.phase, l.bucket
        FROM l LEFT JOIN s ON s.trace_id = l.trace_id AND s.span_id = l.span_id
        WHERE l.phase IS NOT NULL AND l.ent IS NOT NULL AND coalesce(s.complete, true)
        ORDER BY l.ent, l.trace_id, l.span_id, l.t""")
    # An entity whose logs were not collected in the baseline has nothing to compare.
    logged_before: dict[str, int] = defaultdict(int)
    for r in rows:
        logged_before[str(r[0])] += r[6] == 0
    templates = _Templates(cfg)
    walk = _Walk()
    for ent, trace, span, op, body, sev, _phase, bucket in rows:
        if logged_before[str(ent)] < cfg.min_execs:
            continue
        tpl = templates.of(str(body), int(sev))
        start = f"<start of {op}>" if op is not None else None
        walk.add((str(ent), str(trace), str(span)), start, tpl, int(bucket), str(trace))
    walk.close()
    walk.counts.count_silent_executions(_executions(db, scope))
    out = []
    for (ent, a, b), z, observed, rate in walk.counts.scored(cfg):
        # The template the evidence is about: B, or A when the span ended after it, or --
        # when an operation stopped logging altogether -- the one it used to start with.
        shown = b if b != END else a if not a.startswith("<start of ") else \
            walk.counts.usual_next(ent, a)
        level = "error" if templates.is_error(a) or templates.is_error(b) else "info"
        out.append(Evidence(EvidenceKind.LOG_TEMPLATE, templates.text(shown), ent,
                            FaultClass.ERRORS,
                            f"log:{level}:{_short(templates.text(a))} -> "
                            f"{_short(templates.text(b))}", observed, rate, z))
    return out


class _Walk:
    """Transitions between the templates of one span's records, in time order: the first
    follows ``<start of op>`` of the span's operation, the last is followed by END.
    Records outside any known span only count transitions between templates."""

    def __init__(self) -> None:
        self.counts = Counts()
        self._key: tuple[str, str, str] | None = None
        self._prev: str | None = None
        self._bucket = ANOM

    def add(self, key: tuple[str, str, str], start: str | None, tpl: str, bucket: int,
            trace: str) -> None:
        if key != self._key:
            self.close()
            self._key, self._prev = key, start
        if self._prev is not None:
            self._count(key[0], self._prev, tpl, bucket, trace)
        self._prev, self._bucket = tpl, bucket

    def close(self) -> None:
        if self._key is not None and self._prev is not None:
            self._count(self._key[0], self._prev, END, self._bucket, self._key[1])
        self._key = None

    def _count(self, ent: str, a: str, b: str, bucket: int, trace: str) -> None:
        self.counts.add(ent, a, b, bucket, 1, trace)


def _executions(db: Db, scope: Scope) -> dict[tuple[str, str, int], int]:
    """Complete spans (see log_evidence) per (entity, operation, bucket)."""
    rows = db.rows(f"""
        SELECT ent, name, bucket, count(*)
        FROM (SELECT {scope.entity} AS ent, name, {scope.bucket('start_time')} AS bucket,
                     coalesce(epoch_ns(end_time), epoch_ns(start_time) + duration_ns)
                         <= max(epoch_ns(start_time)) OVER (PARTITION BY piece) AS complete
              FROM (SELECT *, {scope.piece('start_time')} AS piece FROM spans
                    WHERE {scope.bounds('start_time')})
              WHERE piece IS NOT NULL)
        WHERE complete AND ent IS NOT NULL GROUP BY ALL""")
    return {(str(e), str(o), int(b)): int(n) for e, o, b, n in rows}


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class _Templates:
    """Masked bodies -> template keys: drain3 clusters, merged when their leading constant
    tokens agree (drain keys clusters on token count, so one statement printing a list of
    varying length would otherwise become many templates)."""

    def __init__(self, cfg: RankConfig) -> None:
        from drain3.drain import Drain

        self._drain = Drain(depth=cfg.drain_depth, sim_th=cfg.drain_sim_th,
                            parametrize_numeric_tokens=False)
        self._lead = cfg.template_lead
        self._key: dict[str, str] = {}
        self._text: dict[str, str] = {}
        self._errors: set[str] = set()

    def of(self, masked: str, severity: int) -> str:
        key = self._key.get(masked)
        if key is None:
            cluster, _ = self._drain.add_log_message(masked)
            template = str(cluster.get_template())
            lead = [t for t in template.split() if "<" not in t][: self._lead]
            key = self._key[masked] = " ".join(lead) or template
            self._text.setdefault(key, template)
        if severity >= 17:  # OTLP ERROR and above
            self._errors.add(key)
        return key

    def text(self, key: str) -> str:
        return self._text.get(key, key)

    def is_error(self, key: str) -> bool:
        return key in self._errors



def log_silence_evidence(db: Db, scope: Scope, cfg: RankConfig) -> list[Evidence]:
    """An entity that was writing logs in the baseline and fell silent while the others went
    on: its share of the records, not their count, so a gap in collection as a whole accuses
    nobody. (Spans have their own, sharper test: see _SpanFacts.crash_evidence.)"""
    rows = db.rows(f"""
        SELECT ent, count(*) FILTER (WHERE phase = 1), count(*) FILTER (WHERE phase = 0),
               arg_max(body, t) FILTER (WHERE phase = 0)
        FROM (SELECT {scope.entity} AS ent, body, time AS t, {scope.phase('time')} AS phase
              FROM logs WHERE {scope.bounds('time')})
        WHERE phase IS NOT NULL AND ent IS NOT NULL GROUP BY ALL""")
    total_a, total_b = sum(r[1] for r in rows), sum(r[2] for r in rows)
    out: list[Evidence] = []
    if total_a < cfg.min_execs or total_b < cfg.min_execs:
        return out
    for ent, na, nb, last in rows:
        expected = nb * total_a / total_b
        if expected >= 20 * cfg.min_execs and na < 0.05 * expected:
            out.append(Evidence(EvidenceKind.LOG_TEMPLATE, str(last), str(ent),
                                FaultClass.CRASH, "silence:logs", float(na), expected,
                                (expected - na) / math.sqrt(na + 1)))
    return out

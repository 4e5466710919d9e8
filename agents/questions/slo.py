"""SLOs and the error budget left, over the window asked about.

The objectives are the model specs' (``qos.slo``), the SLI the same as the burn detector's:
the ingress SERVER span of each request. Budget left = 1 - (bad share / allowed share) over
the window; the burn rate of the last five minutes says how fast it is going now.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agents.questions.model import Ask
from agents.questions.spans import where
from aiops import semconv
from aiops.analytics.slo import Objective

__all__ = ["slo"]

NOW_S = 300.0  # the "burning now" window

_SQL = f"""
    SELECT count(*) AS total,
           count(*) FILTER (WHERE duration_ns > {{threshold_ns}}) AS slow,
           count(*) FILTER (WHERE failed) AS failed
    FROM spans
    {{clause}}
      AND {semconv.INGRESS_SQL} AND kind = 'server'"""


def slo(ask: Ask) -> None:
    i = ask.intent
    objectives = {o.model: o for o in ask.box.objectives}
    models = [i.model] if i.model else sorted(objectives)
    if not models:
        ask.gap("no model declares an SLO (qos.slo in its spec)")
        return
    for model in models:
        o = objectives.get(model)
        if o is None:
            ask.gap(f"{model} declares no SLO (qos.slo in its spec)")
            continue
        _one(ask, o)


def _counts(ask: Ask, o: Objective, since: datetime) -> tuple[int, int, int]:
    clause, params = where("start_time", since, ask.until,
                           (semconv.MODEL, o.model))
    sql = _SQL.format(threshold_ns=int((o.latency_ms or 1e12) * 1e6), clause=clause)
    rows = ask.rows(sql, params)
    r = rows[0] if rows else {"total": 0, "slow": 0, "failed": 0}
    return int(r["total"]), int(r["slow"]), int(r["failed"])


def _one(ask: Ask, o: Objective) -> None:
    total, slow, failed = _counts(ask, o, ask.since)
    now_total, now_slow, now_failed = _counts(ask, o, ask.until - timedelta(seconds=NOW_S))
    if total == 0:
        ask.gap(f"no requests to {o.model} in {ask.window}: its budget was not touched")
        return
    checks = []
    if o.latency_ms is not None:
        checks.append((f"{1 - o.latency_budget:.0%} of requests within {o.latency_ms:g} ms",
                       slow, now_slow, o.latency_budget))
    if o.error_budget is not None:
        checks.append((f"at most {o.error_budget:.1%} of requests failing (5xx)",
                       failed, now_failed, o.error_budget))
    for what, bad, now_bad, allowed in checks:
        share = bad / total
        left = 1 - share / allowed
        burn_now = (now_bad / now_total / allowed) if now_total else 0.0
        ask.report.rows.append({"model": o.model, "objective": what, "requests": total,
                                "bad": bad, "bad_share": round(share, 4),
                                "budget_left": round(left, 4),
                                "burn_rate_5m": round(burn_now, 2)})
        state = (f"{left:.0%} of the error budget left" if left >= 0
                 else f"budget overspent {-left:.0%} beyond it")
        ask.say(f"- {o.model}, SLO {what}: {bad} of {total} requests out ({share:.2%}) in "
                f"{ask.window}: {state}; burning {burn_now:.1f}x the sustainable rate over "
                "the last 5 minutes")

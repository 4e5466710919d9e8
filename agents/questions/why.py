"""Why a model got slow, when no incident says so: its requests minute by minute in the
window, the minutes that ran slow against the window's own usual, the spans inside those
requests that grew, and what changed in the window.

A slowdown under the SLO opens no incident, yet "why did the chat model get slow?" deserves
the telemetry's answer rather than "no incident". Slow minutes are those whose median is at
least ``SLOWER`` times the window's median minute and ``MIN_EXTRA_MS`` above it: relative to
the model's own usual, so no fixed threshold per model.
"""

from __future__ import annotations

import statistics
from typing import Any

from agents.questions import changes
from agents.questions.model import Ask
from agents.questions.spans import FAILED, roots

__all__ = ["MIN_EXTRA_MS", "SLOWER", "why"]

# A minute is slow at 1.5x the usual median and 50 ms above it: smaller swings are the noise
# of a few requests a minute on a shared 2-core machine (the fixtures' healthy cases stay
# under both). Not tuned on an eval set.
SLOWER = 1.5
MIN_EXTRA_MS = 50.0
SHOWN = 5


def why(ask: Ask) -> None:
    model = ask.intent.model
    source, params = roots(ask.since, ask.until, model, None)
    minutes = ask.rows(f"""
        SELECT time_bucket(INTERVAL 1 MINUTE, start_time) AS minute, count(*) AS requests,
               round(quantile_cont(duration_ns, 0.5) / 1e6, 1) AS p50_ms,
               round(quantile_cont(duration_ns, 0.95) / 1e6, 1) AS p95_ms,
               round(avg(CASE WHEN {FAILED} THEN 1 ELSE 0 END), 4) AS failed_share
        {source}
        GROUP BY ALL ORDER BY minute""", params, 24 * 60)
    lead = f"No incident on {model} in {ask.window}"
    if not minutes:
        ask.say(f"{lead}, and no requests to it: nothing to compare.")
        return
    usual = statistics.median(r["p50_ms"] for r in minutes)
    slow = [r for r in minutes
            if r["p50_ms"] >= SLOWER * usual and r["p50_ms"] - usual >= MIN_EXTRA_MS]
    ask.report.rows = [{**r, "minute": f"{r['minute']:%H:%M}", "slow": r in slow}
                       for r in minutes]
    if not slow:
        worst = max(minutes, key=lambda r: r["p50_ms"])
        ask.say(f"{lead}, and it did not run slow: its median held near {usual:g} ms every "
                f"minute (the slowest minute, {worst['minute']:%H:%M} UTC, {worst['p50_ms']:g}"
                f" ms).")
    else:
        start, end = slow[0]["minute"], slow[-1]["minute"]
        during = statistics.median(r["p50_ms"] for r in slow)
        ask.say(f"{lead}, but it ran slow for {len(slow)} minute(s) between {start:%H:%M} and "
                f"{end:%H:%M} UTC: median {during:g} ms against {usual:g} ms in the rest of "
                f"the window (p95 up to {max(r['p95_ms'] for r in slow):g} ms).")
        failed = max(r["failed_share"] for r in slow)
        if failed:
            ask.say(f"Up to {failed:.1%} of its requests failed in those minutes.")
        _grown(ask, [r["minute"] for r in slow])
    table = ask.report.rows
    changes.changes(ask)  # its lines; the table stays the minutes'
    ask.report.rows = table


def _grown(ask: Ask, slow_minutes: list[Any]) -> None:
    """The spans inside the model's requests whose mean duration grew most in the slow
    minutes against the other minutes of the window."""
    source, params = roots(ask.since, ask.until, ask.intent.model, None)
    marks = ", ".join("?" for _ in slow_minutes)
    rows = ask.rows(f"""
        WITH req AS (
            SELECT trace_id,
                   time_bucket(INTERVAL 1 MINUTE, start_time) IN ({marks}) AS slow
            {source})
        SELECT s.service_name, s.name,
               round(avg(s.duration_ns) FILTER (WHERE req.slow) / 1e6, 1) AS slow_ms,
               round(avg(s.duration_ns) FILTER (WHERE NOT req.slow) / 1e6, 1) AS usual_ms,
               count(*) AS spans
        FROM spans s JOIN req USING (trace_id)
        WHERE s.start_time > ? AND s.start_time <= ?
        GROUP BY ALL
        HAVING slow_ms IS NOT NULL AND usual_ms IS NOT NULL
        ORDER BY slow_ms - usual_ms DESC
        LIMIT {SHOWN}""", [*slow_minutes, *params, ask.since, ask.until])
    grew = [r for r in rows if r["slow_ms"] > r["usual_ms"]]
    if not grew:
        ask.say("No span inside its requests grew in those minutes (the time went elsewhere: "
                "queueing before the model, or spans not exported).")
        return
    ask.say("Spans that grew in those minutes (mean, slow minutes against the rest):")
    for r in grew:
        ask.say(f"- {r['service_name']} `{r['name']}`: {r['slow_ms']:g} ms against "
                f"{r['usual_ms']:g} ms")

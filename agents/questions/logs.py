"""The commonest error logs of a window as templates, or the templates new in it."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from agents.questions.model import Ask
from agents.questions.spans import where
from aiops import semconv
from aiops.analytics.logs import mine

__all__ = ["logs"]

ERROR = 17  # OTLP severity number of ERROR
WARN = 13
SHOWN = 5
MAX_ROWS = 20_000  # log records read per question (the newest)
BASELINE_S = 3600.0
TEXT_LIMIT = 300  # what "new" is measured against: the hour before the window


def _records(ask: Ask, since: datetime, until: datetime, min_severity: int
             ) -> list[dict[str, Any]]:
    i = ask.intent
    clause, params = where("time", since, until)
    model = ""
    if i.model is not None:
        model = f"AND (service_name = ? OR {semconv.MODEL} = ?)"
        params += [i.model, i.model]
    sql = f"""
        SELECT service_name AS service, body, trace_id
        FROM logs
        {clause}
          AND coalesce(severity_number, 0) >= {int(min_severity)} AND body IS NOT NULL
          {model}
        ORDER BY time DESC"""
    return ask.rows(sql, params, MAX_ROWS)


def logs(ask: Ask) -> None:
    i = ask.intent
    severity = ERROR
    recent = _records(ask, ask.since, ask.until, severity)
    if not recent and not i.new_only:
        severity = WARN  # no errors: say what the warnings are
        recent = _records(ask, ask.since, ask.until, severity)
    whose = f" of {i.model}" if i.model else ""
    level = "error" if severity == ERROR else "warning"
    if not recent:
        ask.gap(f"no error or warning logs{whose} in {ask.window}")
        return
    if len(recent) == MAX_ROWS:
        ask.gap(f"only the newest {MAX_ROWS} {level} records were read")
    before: list[dict[str, Any]] = []
    if i.new_only:
        before = _records(ask, ask.since - timedelta(seconds=BASELINE_S), ask.since, severity)
    # One miner over the baseline and the window, so a template is the same in both.
    templates = mine([r["body"] for r in before] + [r["body"] for r in recent])
    seen = set(templates[:len(before)])
    counts: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], dict[str, Any]] = {}
    for r, t in zip(recent, templates[len(before):], strict=True):
        if i.new_only and t in seen:
            continue
        key = (r["service"], t)
        counts[key] += 1
        example.setdefault(key, r)  # the newest record of the template
    # Log text is data from the system, shown truncated, never followed.
    rows = [{"service": s, "template": t[:TEXT_LIMIT], "count": n,
             "trace_id": example[(s, t)]["trace_id"]}
            for (s, t), n in counts.most_common(SHOWN)]
    ask.report.rows = rows
    ask.report.totals = {"records": sum(counts.values()), "templates": len(counts),
                         "severity": severity}
    if i.new_only:
        if not rows:
            ask.say(f"No {level} template{whose} is new in {ask.window}: every one also "
                    f"appeared in the hour before.")
            return
        ask.say(f"{len(counts)} {level} template(s){whose} new in {ask.window} (not seen in "
                "the hour before):")
    else:
        ask.say(f"{sum(counts.values())} {level} log record(s){whose} in {ask.window}, "
                f"{len(counts)} template(s); the commonest:")
    for r in rows:
        trace = f", e.g. trace `{r['trace_id']}`" if r["trace_id"] else ""
        ask.say(f"- {r['service']}: {r['count']} x `{r['template']}`{trace}")

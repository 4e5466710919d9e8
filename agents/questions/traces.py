"""The slowest or the failed requests of a window, by trace id."""

from __future__ import annotations

from agents.questions.model import Ask
from agents.questions.spans import FAILED, HTTP_STATUS, MODEL, VERSION, roots

__all__ = ["traces"]

SHOWN = 5


def traces(ask: Ask) -> None:
    i = ask.intent
    failed = i.order == "failed"
    source_sql, params = roots(ask.since, ask.until, i.model, i.version)
    sql = f"""
        SELECT trace_id, {MODEL} AS model, {VERSION} AS version, name,
               round(duration_ns / 1e6, 1) AS duration_ms, {HTTP_STATUS} AS http_status,
               status_code, strftime(start_time, '%Y-%m-%dT%H:%M:%SZ') AS start,
               count(*) OVER () AS matching
        {source_sql}
        {f"AND {FAILED}" if failed else ""}
        ORDER BY {"start_time DESC" if failed else "duration_ns DESC"}, trace_id"""
    rows = ask.rows(sql, params, SHOWN)
    ask.report.rows = rows
    whose = f" to {i.model}" if i.model else ""
    if not rows:
        ask.gap(f"no {'failed ' if failed else ''}requests{whose} in {ask.window}")
        return
    total = rows[0]["matching"]
    ask.report.totals["matching"] = total
    if failed:
        ask.say(f"{total} failed request(s){whose} in {ask.window}; the latest:")
    else:
        ask.say(f"The slowest of {total} request(s){whose} in {ask.window}:")
    for r in rows:
        status = r["http_status"] if r["http_status"] is not None else r["status_code"]
        where = r["model"] + (f"@{r['version']}" if r["version"] else "")
        ask.say(f"- trace `{r['trace_id']}` {where} {r['duration_ms']:g} ms, status {status}, "
                f"at {r['start']}")

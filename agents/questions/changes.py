"""What changed in a window: versions that started or stopped serving, traffic weights,
replicas started or gone quiet (deploys, config applies, restarts, scaling), and
remediation actions.

Serving is read from the spans: a version or replica is new when its first request falls
inside the window and it served nothing in the hour before; one whose last request came more
than a minute before the end went quiet (stopped, or no traffic reached it since).
"""

from __future__ import annotations

from datetime import timedelta

from agents.questions.model import Ask
from agents.questions.spans import REPLICA, VERSION, where
from aiops import semconv
from aiops.semconv import NOT_INGRESS_SQL

__all__ = ["changes"]

LOOKBACK = timedelta(hours=1)  # what served before the window
EDGE = timedelta(seconds=60)  # last seen this close to the end is still serving


def changes(ask: Ask) -> None:
    i = ask.intent
    found: list[tuple[str, str]] = []  # (time, what)
    since = ask.since - LOOKBACK
    # Telemetry that begins inside the window is not a change: what served from its first
    # minute on was there before the store saw it.
    clause, params = where("start_time", since, ask.until)
    first = ask.rows(f"SELECT min(start_time) AS first_at FROM spans\n{clause}", params)
    begins = first[0]["first_at"] if first and first[0]["first_at"] is not None else None
    if begins is not None and begins > ask.since:
        ask.say(f"The telemetry begins at {_t(begins)}, inside the window: what served from "
                "its first minute is not counted as a change.")
    own: set[str] = set()  # aiops' own agent model: its first request is the agent's
    for key, what in ((f"{VERSION} AS version", "version"),
                      (f"{VERSION} AS version, {REPLICA} AS replica", "replica")):
        clause, params = where("start_time", since, ask.until, ("service_name", i.model))
        sql = f"""
            SELECT service_name AS model, {key},
                   min(start_time) AS first_at, max(start_time) AS last_at
            FROM spans
            {clause}
              AND {NOT_INGRESS_SQL} AND {VERSION} IS NOT NULL
              {f"AND {REPLICA} IS NOT NULL" if what == "replica" else ""}
            GROUP BY ALL ORDER BY first_at"""
        for r in ask.rows(sql, params, 500):
            if r["model"] in ask.box.own_models:
                own.add(str(r["model"]))
                continue
            name = f"{r['model']}@{r['version']}" + (
                f" replica {r['replica']}" if what == "replica" else "")
            if r["first_at"] > ask.since and (begins is None or r["first_at"] > begins + EDGE):
                started = "started serving (a deploy or canary)" if what == "version" else \
                    "started (a deploy, config apply, restart or scale-out)"
                found.append((_t(r["first_at"]), f"{name} {started}"))
            if ask.since < r["last_at"] < ask.until - EDGE:
                found.append((_t(r["last_at"]), f"{name} served its last request of the window "
                                                "(stopped, replaced, or idle since)"))
    clause, params = where("time", ask.since, ask.until,
                           (semconv.MODEL, i.model))
    sql = f"""
        SELECT {semconv.MODEL} AS model, {semconv.VERSION} AS version,
               arg_min(value, time) AS first_weight, arg_max(value, time) AS last_weight,
               max(time) AS at
        FROM metric_points
        {clause}
          AND name = 'aiops.serve.traffic_weight'
        GROUP BY ALL HAVING min(value) <> max(value) ORDER BY ALL"""
    for r in ask.rows(sql, params):
        found.append((_t(r["at"]), f"traffic weight of {r['model']}@{r['version']}: "
                                   f"{r['first_weight']:g}% -> {r['last_weight']:g}%"))
    clause, params = where("created_at", ask.since, ask.until)
    target = ""
    if i.model is not None:
        target = "AND (target = ? OR target LIKE ? || '@%')"
        params += [i.model, i.model]
    sql = f"""
        SELECT action_id, kind, target, status, mode, created_at
        FROM actions_current
        {clause}
          {target}
        ORDER BY created_at"""
    for r in ask.rows(sql, params):
        found.append((_t(r["created_at"]), f"action `{r['action_id']}` {r['kind']} "
                                           f"{r['target']}: {r['status']} (policy mode "
                                           f"{r['mode']})"))
    found.sort()
    if own:
        ask.say(f"Not counted: {', '.join(sorted(own))}, the model aiops' own agent asks "
                "(its traffic is these answers, not a change to what you serve).")
    ask.report.rows = [{"time": t, "change": what} for t, what in found]
    whose = f" to {i.model}" if i.model else ""
    if not found:
        ask.say(f"No change{whose} seen in {ask.window}: no version or replica started or "
                "went quiet, no traffic weight moved, no action was taken.")
        return
    ask.say(f"{len(found)} change(s){whose} in {ask.window}:")
    for t, what in found:
        ask.say(f"- {t} {what}")


def _t(value: object) -> str:
    return f"{value:%Y-%m-%dT%H:%M:%SZ}" if hasattr(value, "strftime") else str(value)

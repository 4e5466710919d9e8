"""Latency percentiles, two versions side by side, and token throughput."""

from __future__ import annotations

from typing import Any

from agents.questions.model import Ask
from agents.questions.spans import (
    FAILED,
    MODEL,
    REPLICA,
    VERSION,
    column,
    label,
    percentile_columns,
    roots,
    where,
)
from aiops.semconv import NOT_INGRESS_SQL

__all__ = ["DEFAULT_PERCENTILES", "compare", "latency", "throughput"]

DEFAULT_PERCENTILES = [50.0, 95.0, 99.0]


def _name(row: dict[str, Any]) -> str:
    where = str(row["model"])
    if row.get("version"):
        where += f"@{row['version']}"
    if row.get("replica"):
        where += f" replica {row['replica']}"
    return where


def latency(ask: Ask) -> None:
    i = ask.intent
    ps = i.percentiles or DEFAULT_PERCENTILES
    if not i.percentiles:
        ask.say(f"No percentile named: {'/'.join(label(p) for p in ps)}.")
    cols = percentile_columns(ps)
    if i.by == "replica":
        # Replicas are known inside the model: its own spans (time spent in the replica).
        clause, params = where("start_time", ask.since, ask.until, ("service_name", i.model),
                               (VERSION, i.version))
        sql = f"""
            SELECT service_name AS model, {VERSION} AS version, {REPLICA} AS replica,
                   count(*) AS requests, {cols}
            FROM spans
            {clause}
              AND {REPLICA} IS NOT NULL AND {NOT_INGRESS_SQL}
            GROUP BY ALL ORDER BY model, version, replica"""
        source = "the model's own spans (time inside each replica)"
    else:
        versioned = i.by == "version" or i.version is not None
        source_sql, params = roots(ask.since, ask.until, i.model, i.version)
        sql = f"""
            SELECT {MODEL} AS model{f", {VERSION} AS version" if versioned else ""},
                   count(*) AS requests, {cols}
            {source_sql}
            GROUP BY ALL ORDER BY ALL"""
        source = "each request's root span (as its client saw it)"
    rows = ask.rows(sql, params)
    ask.report.rows = rows
    if not rows:
        ask.gap(f"no requests{' to ' + i.model if i.model else ''}"
                f"{' ' + i.version if i.version else ''} in {ask.window}")
        return
    ask.say(f"Latency over {ask.window}, from {source}:")
    for r in rows:
        figures = ", ".join(f"{label(p)} {r[column(p)]:g} ms" for p in ps)
        ask.say(f"- {_name(r)}: {figures} ({r['requests']} requests)")


def compare(ask: Ask) -> None:
    i = ask.intent
    ps = i.percentiles or DEFAULT_PERCENTILES
    source_sql, params = roots(ask.since, ask.until, i.model, None)
    sql = f"""
        SELECT {MODEL} AS model, {VERSION} AS version, count(*) AS requests,
               round(avg(CASE WHEN {FAILED} THEN 1 ELSE 0 END), 4) AS failed_share,
               {percentile_columns(ps)}
        {source_sql}
        GROUP BY ALL ORDER BY model, version"""
    rows = [r for r in ask.rows(sql, params) if r["version"] is not None]
    if i.versions:
        served = {r["version"] for r in rows}
        for v in i.versions:
            if v not in served:
                ask.gap(f"{v} served no requests{' of ' + i.model if i.model else ''} in "
                        f"{ask.window}")
        rows = [r for r in rows if r["version"] in i.versions]
    ask.report.rows = rows
    if not rows:
        ask.gap(f"no versioned requests{' to ' + i.model if i.model else ''} in {ask.window}")
        return
    ask.say(f"Versions side by side over {ask.window} (root spans):")
    for r in rows:
        figures = ", ".join(f"{label(p)} {r[column(p)]:g} ms" for p in ps)
        ask.say(f"- {_name(r)}: {r['requests']} requests, {r['failed_share']:.1%} failed, "
                f"{figures}")
    for m in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == m]
        if len(mine) < 2:
            ask.gap(f"only {mine[0]['version']} of {m} served in {ask.window}: nothing to "
                    "compare it with")
            continue
        base, other = mine[0], mine[-1]
        p = column(ps[-1])
        if base[p]:
            ask.say(f"{m}: {label(ps[-1])} of {other['version']} is "
                    f"{other[p] / base[p]:.2f}x {base['version']}'s; failed "
                    f"{other['failed_share']:.1%} vs {base['failed_share']:.1%}.")


def throughput(ask: Ask) -> None:
    """Requests per second (each request's root span, as the latency answer counts them) and,
    for generative models, tokens per second (the model's own spans)."""
    i = ask.intent
    versioned = i.by == "version" or i.version is not None
    version_column = f", {VERSION} AS version" if versioned else ""
    source_sql, params = roots(ask.since, ask.until, i.model, i.version)
    requests = ask.rows(f"""
        SELECT {MODEL} AS model{version_column}, count(*) AS requests
        {source_sql}
        GROUP BY ALL ORDER BY ALL""", params)
    tokens = "TRY_CAST(attributes->>'gen_ai.usage.{}_tokens' AS BIGINT)"
    clause, params = where("start_time", ask.since, ask.until, ("service_name", i.model),
                           (VERSION, i.version))
    sql = f"""
        SELECT service_name AS model{version_column},
               count(*) AS token_requests,
               coalesce(sum({tokens.format('output')}), 0) AS output_tokens,
               coalesce(sum({tokens.format('input')}), 0) AS input_tokens,
               epoch_ns(min(start_time)) // 1000000 AS first_ms,
               epoch_ns(max(end_time)) // 1000000 AS last_ms
        FROM spans
        {clause}
          AND {NOT_INGRESS_SQL}
          AND (attributes->>'gen_ai.usage.output_tokens') IS NOT NULL
        GROUP BY ALL ORDER BY ALL"""
    seconds = (ask.until - ask.since).total_seconds()

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model"], r["version"]) if versioned else (r["model"],)

    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in requests:
        rows[key(r)] = {**r, "requests_per_s": round(r["requests"] / seconds, 3)}
    for r in ask.rows(sql, params):
        row = rows.setdefault(key(r), {"model": r["model"], **(
            {"version": r["version"]} if versioned else {}), "requests": 0,
            "requests_per_s": 0.0})
        busy = max((r.pop("last_ms") - r.pop("first_ms")) / 1e3, 1e-3)
        row.update(r, output_tokens_per_s=round(r["output_tokens"] / seconds, 2),
                   input_tokens_per_s=round(r["input_tokens"] / seconds, 2),
                   output_tokens_per_s_active=round(r["output_tokens"] / busy, 2))
    if versioned:  # each version's share of its model's requests: the traffic split
        totals: dict[str, int] = {}
        for r in rows.values():
            totals[r["model"]] = totals.get(r["model"], 0) + r["requests"]
        for r in rows.values():
            r["share"] = round(r["requests"] / totals[r["model"]], 4) if totals[r["model"]] \
                else 0.0
    ask.report.rows = list(rows.values())
    named = f"for {i.model} " if i.model else ""
    if not rows:
        ask.gap(f"no requests {named}in {ask.window}")
        return
    ask.say(f"Throughput over {ask.window} ({seconds:g} s):")
    for r in ask.report.rows:
        share = f", {r['share']:.0%} of {r['model']}'s" if "share" in r else ""
        line = (f"- {_name(r)}: {r['requests_per_s']:g} requests/s ({r['requests']} requests"
                f"{share})")
        if r.get("output_tokens"):
            line += (f"; {r['output_tokens_per_s']:g} output tokens/s ({r['output_tokens']} "
                     f"tokens in {r['token_requests']} requests; "
                     f"{r['output_tokens_per_s_active']:g}/s between its first and last), "
                     f"{r['input_tokens_per_s']:g} input tokens/s")
        elif r.get("input_tokens"):  # an embedding model: tokens in, vectors out
            line += (f"; {r['input_tokens_per_s']:g} input tokens/s ({r['input_tokens']} "
                     "tokens), no output tokens")
        ask.say(line)
    if not any("output_tokens" in r or "input_tokens" in r for r in ask.report.rows):
        ask.say(f"No token counts (gen_ai.usage.*) {named}in {ask.window}: only generative "
                "models report tokens.")

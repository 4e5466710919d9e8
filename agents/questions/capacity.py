"""Whether a model's replicas would serve a multiple of today's load, and how many it takes.

The load is measured as requests in service at once (Little's law: the time requests spent in
the model's replicas per second of the window), in the window and in its busiest minute; the
verdict applies Serve's own autoscaling rule to it (desired replicas = ceil(in service /
target_ongoing_requests), within min/max_replicas: ``aiops.capacity.plan``) and the spec's
hard limit (max_replicas x max_ongoing_requests; past it requests wait at the ingress, and
past ``max_queue`` are refused). It assumes a request takes as long as it does now, which
replicas sharing CPUs do not keep: the answer says so.
"""

from __future__ import annotations

from typing import Any

from agents.questions.model import Ask
from agents.questions.spans import MODEL, REPLICA
from aiops.analytics.findings import NOT_WARMUP
from aiops.capacity import Capacity, Fit, plan
from aiops.semconv import NOT_INGRESS_SQL

__all__ = ["capacity"]


def capacity(ask: Ask) -> None:
    i = ask.intent
    window_s = i.minutes * 60
    params: list[Any] = [ask.since, ask.until]
    model_filter = ""
    if i.model is not None:
        model_filter = f"AND {MODEL} = ?"
        params.append(i.model)
    # A request's time in the model is its span there that no span of the same service
    # encloses (a replica's inner spans would count it twice).
    sql = f"""
        WITH top AS (
            SELECT {MODEL} AS model, {REPLICA} AS replica, start_time, duration_ns
            FROM spans s
            WHERE start_time > ? AND start_time <= ?
              AND {NOT_INGRESS_SQL} AND {MODEL} IS NOT NULL AND {NOT_WARMUP}
              {model_filter}
              AND NOT EXISTS (SELECT 1 FROM spans p WHERE p.trace_id = s.trace_id
                              AND p.span_id = s.parent_span_id
                              AND p.service_name = s.service_name)),
        minutes AS (
            SELECT model, date_trunc('minute', start_time) AS minute,
                   sum(duration_ns) / 60e9 AS in_service
            FROM top GROUP BY ALL)
        SELECT t.model, count(*) AS requests, count(DISTINCT t.replica) AS replicas,
               round(sum(t.duration_ns) / 1e9 / {window_s:g}, 3) AS mean_in_service,
               round(any_value(m.peak), 3) AS peak_in_service
        FROM top t JOIN (SELECT model, max(in_service) AS peak FROM minutes GROUP BY model) m
          USING (model)
        GROUP BY t.model ORDER BY peak_in_service DESC"""
    rows = ask.rows(sql, params)
    ask.report.rows = rows
    if not rows:
        ask.gap(f"no requests{' to ' + i.model if i.model else ''} in {ask.window} to "
                "measure a load on")
        return
    multiple = i.load
    ask.say(f"Capacity {'at ' + format(multiple, 'g') + 'x' if multiple else 'headroom'} "
            f"over {ask.window}, from the time requests spent in each model's replicas "
            "(requests in service at once; the busiest minute is what must fit):")
    for r in rows:
        _verdict(ask, r, multiple)
    ask.say("This assumes each request takes as long as it does now. Replicas that share "
            "CPUs slow each other as more are added, so on a busy machine these replica "
            "counts are a floor.")


def _verdict(ask: Ask, r: dict[str, Any], multiple: float | None) -> None:
    now = (f"{r['peak_in_service']:g} requests in service in its busiest minute "
           f"({r['mean_in_service']:g} on average, {r['requests']} requests"
           + (f", {r['replicas']} replica(s) answered" if r["replicas"] else "") + ")")
    cap = ask.box.capacities.get(r["model"])
    asked = r["peak_in_service"] * (multiple or 1.0)
    p = plan(asked, cap) if cap is not None else None
    if cap is None or p is None:
        ask.say(f"- {r['model']}: {now}.")
        ask.gap(f"{r['model']}: no spec with its autoscaling limits, so no verdict "
                "(max_replicas and target_ongoing_requests are what a load is judged by)")
        return
    r.update(asked_in_service=round(asked, 3), replicas_needed=p.wanted, fit=str(p.fit),
             max_replicas=cap.max_replicas, headroom=p.headroom_target)
    ask.say(f"- {r['model']}: {now}.")
    cpus = f" ({p.wanted * cap.num_cpus:g} of Ray's CPUs reserved)" if cap.num_cpus else ""
    if multiple is not None:
        at = f"At {multiple:g}x: {asked:.2f} in service; "
        if p.fit is Fit.FITS:
            ask.say(f"  {at}**yes**: Serve's autoscaler runs {p.wanted} replica(s) for it "
                    f"(target {cap.target_ongoing:g} per replica), within max_replicas "
                    f"{cap.max_replicas}{cpus}.")
        elif p.fit is Fit.ABOVE_TARGET:
            ask.say(f"  {at}**only above target**: it would need {p.wanted} replicas, its "
                    f"spec allows {cap.max_replicas}; those would hold "
                    f"{asked / cap.max_replicas:.1f} each against a target of "
                    f"{cap.target_ongoing:g} (latency rises). Raise "
                    f"autoscaling.max_replicas to {p.wanted}{cpus}.")
        else:
            slots = (cap.max_replicas or 0) * (cap.max_ongoing or 0)
            refused = (f", and past max_queue {cap.max_queue} they are refused (429)"
                       if cap.max_queue else "")
            ask.say(f"  {at}**no**: more than its {cap.max_replicas} replicas x "
                    f"{cap.max_ongoing} slots = {slots} at once; the rest wait at the "
                    f"ingress{refused}. It needs {p.wanted} replicas at target: raise "
                    f"autoscaling.max_replicas to {p.wanted}{cpus}.")
    _headroom(ask, cap, p.headroom_target, p.headroom_slots, multiple)


def _headroom(ask: Ask, cap: Capacity, at_target: float | None, slots: float | None,
              multiple: float | None) -> None:
    if at_target is None:
        return
    base = multiple or 1.0  # the plan was made for the asked load: today's is base x less
    line = (f"  Headroom: {at_target * base:.1f}x its busiest minute with "
            f"{cap.max_replicas} replica(s) at target")
    if slots is not None:
        line += f", {slots * base:.1f}x before every replica's slots are taken"
    ask.say(line + ".")

"""Incidents and actions: the analyzer's incidents, the remediation actions and the ledger,
read from the server's JSON API through Infinity, with incidents and ledger entries as
annotations on the time axis."""

from __future__ import annotations

from dashboards.infinity import Column, Infinity
from dashboards.panels import Board, infinity_variable, table_panel, timeseries_panel
from dashboards.sql import RANGE, epoch_ms, in_range

__all__ = ["incidents"]

INCIDENT_COLUMNS = [
    Column("incident_id"), Column("opened_at", "timestamp"), Column("status"),
    Column("severity"), Column("service"), Column("model_version"), Column("fault_class"),
    Column("summary"), Column("updated_at", "timestamp"),
]


def incidents() -> Board:
    b = Board("aiops-incidents", "aiops / Incidents and actions",
              "Active incidents, their root causes, remediation actions and the tamper-evident "
              "ledger.", tags=["incidents"])
    b.variables.append(infinity_variable(
        "incident", "incident",
        Infinity.get("/api/v1/incidents?limit=100", "incidents", [Column("incident_id")])))
    b.annotate("Incidents opened", "red", Infinity.sql(
        f"""{RANGE}
        SELECT {epoch_ms('opened_at')} AS time, summary AS text,
               concat_ws(',', status, fault_class, service) AS tags
        FROM incidents_current, r WHERE {in_range('opened_at')}""",
        [Column("time", "timestamp_epoch"), Column("text"), Column("tags")]))
    b.annotate("Ledger entries", "blue", Infinity.sql(
        f"""{RANGE}
        SELECT {epoch_ms('time')} AS time,
               concat_ws(' ', actor, entry->>'kind', entry->>'target', entry->>'status') AS text,
               actor AS tags
        FROM ledger, r WHERE {in_range('time')}""",
        [Column("time", "timestamp_epoch"), Column("text"), Column("tags")]))
    b.row("Now").add(
        table_panel("Active incidents", "Open and mitigating incidents, newest first "
                    "(GET /api/v1/incidents?status=active).",
                    Infinity.get("/api/v1/incidents?status=active", "incidents",
                                 INCIDENT_COLUMNS)),
        table_panel("Root causes of $incident", "Ranked causes with their confidence "
                    "(GET /api/v1/incidents/{id}).",
                    Infinity.get("/api/v1/incidents/${incident}", "evidence.root_causes",
                                 [Column("entity"), Column("fault_class"),
                                  Column("confidence", "number"), Column("score", "number"),
                                  Column("detectors")]), height=6),
    )
    b.row("History").add(
        timeseries_panel("Incidents opened", "Incidents opened per bucket, by fault class.",
                         "short", Infinity.sql(
                             f"""{RANGE}
                             SELECT epoch_ms(time_bucket(to_seconds(greatest(r.step_s, 60)),
                                                         opened_at::TIMESTAMP)) AS time,
                                    coalesce(fault_class, 'unknown') AS fault_class,
                                    count(*) AS incidents
                             FROM incidents_current, r WHERE {in_range('opened_at')}
                             GROUP BY ALL ORDER BY time""",
                             [Column("time", "timestamp_epoch"), Column("fault_class"),
                              Column("incidents", "number")]).timeseries(), width=24),
        table_panel("Incidents in the range", "Every incident opened in the dashboard range, "
                    "in its latest state.", Infinity.sql(
                        f"""{RANGE}
                        SELECT incident_id, opened_at, status, severity, service,
                               model_version, fault_class, summary, updated_at
                        FROM incidents_current, r WHERE {in_range('opened_at')}
                        ORDER BY opened_at DESC""", INCIDENT_COLUMNS)),
    )
    b.row("Actions and ledger").add(
        table_panel("Remediation actions", "Actions in their latest state, newest first "
                    "(GET /api/v1/actions).",
                    Infinity.get("/api/v1/actions", "actions", [
                        Column("action_id"), Column("incident_id"),
                        Column("created_at", "timestamp"), Column("kind"), Column("target"),
                        Column("mode"), Column("status")])),
        table_panel("Ledger", "The hash-chained record of every action and decision.",
                    Infinity.sql(
                        f"""{RANGE}
                        SELECT seq, {epoch_ms('time')} AS time, actor, action_id,
                               (entry->>'kind') AS kind, (entry->>'target') AS target,
                               (entry->>'status') AS status, hash
                        FROM ledger, r WHERE {in_range('time')} ORDER BY seq DESC""",
                        [Column("seq", "number"), Column("time", "timestamp_epoch"),
                         Column("actor"), Column("action_id"), Column("kind"),
                         Column("target"), Column("status"), Column("hash")])),
    )
    return b

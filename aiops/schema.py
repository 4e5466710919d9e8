"""The telemetry schema, declared once.

DuckDB DDL (``Table.ddl``), Arrow schemas (``Table.arrow_schema``) and the documentation in
``docs/schema.md`` all derive from the declarations below. Timestamps are UTC nanoseconds
(``TIMESTAMP_NS``); trace and span ids are lower-case hex, as in W3C ``traceparent``; attribute
maps are JSON (DuckDB ingests JSON-as-text from Arrow about twice as fast as MAP columns).
Changing a table means adding a migration in ``aiops.migrations`` as well.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from aiops import semconv

__all__ = [
    "ACTIONS",
    "INCIDENTS",
    "LEDGER",
    "LOGS",
    "METRIC_POINTS",
    "NODE_ATTR",
    "NODE_LOST_EVENT",
    "NODE_REPLACED_EVENT",
    "PROVENANCE",
    "RETIRED_EVENT",
    "SPANS",
    "TABLES",
    "Column",
    "Derived",
    "Kind",
    "Table",
    "schema_reference",
    "table",
]

# Event name of the log record a replica emits when Serve stops it on purpose (scale-in,
# rollback, redeploy; ``serve.hooks.retire``): its exit afterwards is no crash.
RETIRED_EVENT = "aiops.replica.retired"
# Event names of the records the Serve driver emits when a Ray node is lost, and once the
# replicas it held run elsewhere (serve.nodes); live analytics open and close on them.
NODE_LOST_EVENT = "aiops.node.lost"
NODE_REPLACED_EVENT = "aiops.node.replaced"
NODE_ATTR = "aiops.node.name"  # head, worker-1, ...: the name aiops gives a Ray node


class Kind(enum.Enum):
    """Column types, each with its DuckDB and Arrow spelling."""

    VARCHAR = ("VARCHAR", pa.string(), "text")
    BIGINT = ("BIGINT", pa.int64(), "integer")
    INTEGER = ("INTEGER", pa.int32(), "integer")
    DOUBLE = ("DOUBLE", pa.float64(), "number")
    BOOLEAN = ("BOOLEAN", pa.bool_(), "boolean")
    TIMESTAMP = ("TIMESTAMP_NS", pa.timestamp("ns"), "UTC time")
    # JSON text kept as VARCHAR: DuckDB's JSON operators (->, ->>, json_extract) read it just
    # the same, and single-threaded ingest is ~25% faster without the JSON type's validation
    # on insert. The writers (OTLP decoders, scraper) only ever produce valid JSON.
    JSON = ("VARCHAR", pa.string(), "JSON text")
    DOUBLES = ("DOUBLE[]", pa.list_(pa.float64()), "list")
    BIGINTS = ("BIGINT[]", pa.list_(pa.int64()), "list")

    @property
    def duckdb(self) -> str:
        return self.value[0]

    @property
    def arrow(self) -> pa.DataType:
        return self.value[1]


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    doc: str
    nullable: bool = True


@dataclass(frozen=True)
class Derived:
    """A typed column the store fills at ingest from the row's own columns (``sql``, over
    the written row), so readers do not re-parse JSON per query. Never written by a sender."""

    name: str
    kind: Kind
    doc: str
    sql: str


# Columns the server fills, never a sender: which credential exported the row.
SERVER_SET = frozenset({"ingest_credential"})


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    derived: tuple[Derived, ...] = ()
    # SELECT of a source's written columns plus the derived ones, as the store inserts them;
    # None: each derived column's own ``sql``.
    derive: Callable[[str, tuple[str, ...]], str] | None = None

    def insert_select(self, source: str, derived_given: bool = False) -> str:
        """The SELECT the store inserts a batch of written columns with; ``derived_given``:
        the batch holds the derived columns too, after the written ones, already computed."""
        if not self.derived or derived_given:
            return f"SELECT * FROM {source}"
        if self.derive is not None:
            return self.derive(source, tuple(d.name for d in self.derived))
        return f"SELECT *, {', '.join(d.sql for d in self.derived)} FROM {source}"

    def archived_select(self, source: str, present: set[str]) -> str:
        """SELECT over archived rows (``source``, whose columns are ``present``): a file
        written before a derived column existed lacks it, or holds NULLs where the union of
        old and new files fills one in; it is derived from the row's own columns there."""
        if not self.derived:
            return f"SELECT * FROM {source}"
        kept = [d for d in self.derived if d.name in present]
        added = [d for d in self.derived if d.name not in present]
        replace = (" REPLACE (" + ", ".join(
            f"coalesce({d.name}, CAST({d.sql} AS {d.kind.duckdb})) AS {d.name}" for d in kept)
            + ")") if kept else ""
        extra = "".join(f", CAST({d.sql} AS {d.kind.duckdb}) AS {d.name}" for d in added)
        return f"SELECT *{replace}{extra} FROM {source}"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.kind.arrow, nullable=c.nullable) for c in self.columns]
        )

    @property
    def stored_schema(self) -> pa.Schema:
        """The Arrow schema of a stored row: the written columns, then the derived ones."""
        return pa.schema([*self.arrow_schema,
                          *(pa.field(d.name, d.kind.arrow) for d in self.derived)])

    @property
    def wire(self) -> Table:
        """The columns a sender's record fills (every one but those the server sets)."""
        return Table(self.name, self.doc,
                     tuple(c for c in self.columns if c.name not in SERVER_SET))

    def ddl(self) -> str:
        cols = ",\n  ".join(
            [f"{c.name} {c.kind.duckdb}{'' if c.nullable else ' NOT NULL'}"
             for c in self.columns] + [f"{d.name} {d.kind.duckdb}" for d in self.derived]
        )
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n  {cols}\n)"


def _c(name: str, kind: Kind, doc: str, *, required: bool = False) -> Column:
    return Column(name, kind, doc, nullable=not required)


def _sources(signal: str, row: str, column: str) -> str:
    shown = {"attr": f"the {row}'s `{{}}`", "resource": "the resource's `{}`",
             "component": "Ray's `Component` label (`ray::ServeReplica:<app>:<deployment>`)"}
    return ", else ".join(shown[s.where].format(s.key)
                          for s in semconv.CONVENTIONS[signal][column])


_MEANING = {
    semconv.MODEL: ("Model requested", Kind.VARCHAR),
    semconv.VERSION: ("Release that served it", Kind.VARCHAR),
    semconv.REPLICA: ("Ray Serve replica id", Kind.VARCHAR),
    semconv.DEPLOYMENT: ("Ray Serve deployment", Kind.VARCHAR),
    semconv.APP: ("Ray Serve application", Kind.VARCHAR),
}


def _identity(signal: str, row: str, columns: tuple[str, ...] = (
        semconv.MODEL, semconv.VERSION, semconv.REPLICA)) -> tuple[Derived, ...]:
    """The typed identity columns of ``signal``'s table (whose rows are ``row``s), read
    where ``aiops.semconv``'s conventions table says."""
    return tuple(Derived(c, _MEANING[c][1], f"{_MEANING[c][0]}: {_sources(signal, row, c)}.",
                         semconv.RAW[signal][c]) for c in columns)


_RESOURCE = (
    _c("service_name", Kind.VARCHAR, "Resource attribute service.name."),
    _c("resource_attributes", Kind.JSON, "All resource attributes."),
    _c("scope_name", Kind.VARCHAR, "Instrumentation scope name."),
    _c("scope_version", Kind.VARCHAR, "Instrumentation scope version."),
)

SPANS = Table(
    "spans",
    "One row per OTLP span.",
    (
        _c("trace_id", Kind.VARCHAR, "32 hex digits.", required=True),
        _c("span_id", Kind.VARCHAR, "16 hex digits.", required=True),
        _c("parent_span_id", Kind.VARCHAR, "16 hex digits; NULL for a root span."),
        _c("trace_state", Kind.VARCHAR, "W3C tracestate."),
        _c("name", Kind.VARCHAR, "Span name.", required=True),
        _c("kind", Kind.VARCHAR, "internal, server, client, producer or consumer."),
        _c("start_time", Kind.TIMESTAMP, "Start, UTC.", required=True),
        _c("end_time", Kind.TIMESTAMP, "End, UTC."),
        _c("duration_ns", Kind.BIGINT, "end_time - start_time in nanoseconds."),
        _c("status_code", Kind.VARCHAR, "unset, ok or error."),
        _c("status_message", Kind.VARCHAR, "Status description."),
        *_RESOURCE,
        _c("attributes", Kind.JSON, "Span attributes."),
        _c("events", Kind.JSON, "List of {time, name, attributes}."),
        _c("links", Kind.JSON, "List of {trace_id, span_id, trace_state, attributes}."),
        _c("dropped_attributes_count", Kind.BIGINT, "Attributes the sender dropped."),
        _c("ingest_credential", Kind.VARCHAR, "Name of the credential that exported the row "
           "(a token's name, `anonymous`); NULL for rows the server wrote itself."),
    ),
    (
        *_identity("spans", "span"),
        Derived(semconv.HTTP_STATUS, Kind.INTEGER, "HTTP status (`http.response.status_code`, "
                "else the older `http.status_code`).", semconv.HTTP_STATUS_SQL),
        Derived(semconv.FAILED, Kind.BOOLEAN, "Status `error` or an HTTP 5xx.",
                semconv.FAILED_SQL),
        # Appended after the columns above: a migrated table adds them last (migration 10).
        *_identity("spans", "span", (semconv.DEPLOYMENT, semconv.APP)),
    ),
    semconv.ingest_select("spans"),
)

LOGS = Table(
    "logs",
    "One row per OTLP log record.",
    (
        _c("time", Kind.TIMESTAMP, "Event time (observed time when the sender gave none)."),
        _c("observed_time", Kind.TIMESTAMP, "When the sender observed the record."),
        _c("trace_id", Kind.VARCHAR, "32 hex digits, when the record belongs to a trace."),
        _c("span_id", Kind.VARCHAR, "16 hex digits, when the record belongs to a span."),
        _c("severity_number", Kind.INTEGER, "OTLP severity number (1-24)."),
        _c("severity_text", Kind.VARCHAR, "Severity as the sender spelled it."),
        _c("body", Kind.VARCHAR, "Body; non-string bodies are JSON-encoded."),
        _c("event_name", Kind.VARCHAR, "OTLP event name."),
        *_RESOURCE,
        _c("attributes", Kind.JSON, "Log attributes (e.g. inference_id)."),
        _c("flags", Kind.BIGINT, "W3C trace flags."),
        _c("ingest_credential", Kind.VARCHAR, "Name of the credential that exported the row "
           "(a token's name, `anonymous`); NULL for rows the server wrote itself."),
    ),
    _identity("logs", "record", semconv.IDENTITY),
    semconv.ingest_select("logs"),
)

METRIC_POINTS = Table(
    "metric_points",
    "One row per metric data point (gauge, sum, histogram, exponential histogram, summary).",
    (
        _c("time", Kind.TIMESTAMP, "Point time, UTC.", required=True),
        _c("start_time", Kind.TIMESTAMP, "Start of the aggregation window."),
        _c("name", Kind.VARCHAR, "Metric name.", required=True),
        _c("description", Kind.VARCHAR, "Metric description."),
        _c("unit", Kind.VARCHAR, "UCUM unit."),
        _c("type", Kind.VARCHAR, "gauge, sum, histogram, exponential_histogram or summary."),
        _c("temporality", Kind.VARCHAR, "cumulative or delta (sums and histograms)."),
        _c("is_monotonic", Kind.BOOLEAN, "Monotonic sum (a counter)."),
        _c("value", Kind.DOUBLE, "Gauge or sum value."),
        _c("count", Kind.BIGINT, "Histogram/summary count."),
        _c("sum", Kind.DOUBLE, "Histogram/summary sum."),
        _c("min", Kind.DOUBLE, "Histogram minimum."),
        _c("max", Kind.DOUBLE, "Histogram maximum."),
        _c("bucket_counts", Kind.BIGINTS, "Explicit-bucket histogram counts."),
        _c("explicit_bounds", Kind.DOUBLES, "Explicit-bucket histogram upper bounds."),
        _c("exp_histogram", Kind.JSON, "Exponential histogram {scale, zero_count, ...}."),
        _c("quantiles", Kind.JSON, "Summary quantiles [{quantile, value}]."),
        _c("exemplars", Kind.JSON, "Exemplars [{time, value, trace_id, span_id}]."),
        *_RESOURCE,
        _c("attributes", Kind.JSON, "Point attributes (labels)."),
        _c("ingest_credential", Kind.VARCHAR, "Name of the credential that exported the row "
           "(a token's name, `anonymous`); NULL for rows the server wrote itself."),
    ),
    _identity("metric_points", "point", semconv.IDENTITY),
    semconv.ingest_select("metric_points"),
)

INCIDENTS = Table(
    "incidents",
    "Incidents opened by the detectors.",
    (
        _c("incident_id", Kind.VARCHAR, "Unique id.", required=True),
        _c("opened_at", Kind.TIMESTAMP, "When it was opened.", required=True),
        _c("closed_at", Kind.TIMESTAMP, "When it was resolved."),
        _c("status", Kind.VARCHAR, "open, mitigating or resolved.", required=True),
        _c("severity", Kind.VARCHAR, "Severity."),
        _c("service", Kind.VARCHAR, "Attributed service."),
        _c("replica", Kind.VARCHAR, "Attributed replica."),
        _c("model_version", Kind.VARCHAR, "Attributed model version."),
        _c("fault_class", Kind.VARCHAR, "Attributed fault class."),
        _c("summary", Kind.VARCHAR, "One-line summary."),
        _c("evidence", Kind.JSON, "Root causes, findings and context: traces, log "
           "templates, metric deltas, eBPF signals, changes."),
        _c("updated_at", Kind.TIMESTAMP, "When this state was written: each change is a new "
           "row; the latest row per incident_id is its state (view incidents_current)."),
    ),
)

ACTIONS = Table(
    "actions",
    "Remediation actions planned or taken.",
    (
        _c("action_id", Kind.VARCHAR, "Unique id.", required=True),
        _c("incident_id", Kind.VARCHAR, "The incident it answers."),
        _c("created_at", Kind.TIMESTAMP, "When it was planned.", required=True),
        _c("kind", Kind.VARCHAR, "scale, rollback, shift_traffic, shed_load ...", required=True),
        _c("target", Kind.VARCHAR, "Deployment or model version acted on."),
        _c("params", Kind.JSON, "Parameters."),
        _c("mode", Kind.VARCHAR, "off, dry_run, approve or auto (the policy's decision)."),
        _c("status", Kind.VARCHAR, "proposed, denied, dry_run, pending, approved, executed, "
           "verified, failed, expired, withdrawn."),
        _c("outcome", Kind.JSON, "What happened, including verification."),
        _c("updated_at", Kind.TIMESTAMP, "When this state was written: each change is a new "
           "row; the latest per action_id is its state (view actions_current)."),
    ),
)

LEDGER = Table(
    "ledger",
    "Tamper-evident, hash-chained record of every action and decision.",
    (
        _c("seq", Kind.BIGINT, "Position in the chain, from 1.", required=True),
        _c("time", Kind.TIMESTAMP, "When it was written.", required=True),
        _c("actor", Kind.VARCHAR, "Who: policy, agent, a user.", required=True),
        _c("action_id", Kind.VARCHAR, "The action it records."),
        _c("entry", Kind.JSON, "The recorded content.", required=True),
        _c("prev_hash", Kind.VARCHAR, "Hash of entry seq-1.", required=True),
        _c("hash", Kind.VARCHAR, "sha256 over prev_hash and this entry.", required=True),
    ),
)

PROVENANCE = Table(
    "provenance",
    "One hash-chained entry per inference: what answered, on what, for which input.",
    (
        _c("seq", Kind.BIGINT, "Position in the chain, from 1.", required=True),
        _c("time", Kind.TIMESTAMP, "When the inference finished, UTC.", required=True),
        _c("trace_id", Kind.VARCHAR, "Trace of the request."),
        _c("inference_id", Kind.VARCHAR, "The request's inference id."),
        _c("model", Kind.VARCHAR, "Model name."),
        _c("version", Kind.VARCHAR, "Model version."),
        _c("artifact_digest", Kind.VARCHAR, "sha256 of the artifact (or package manifest)."),
        _c("input_hash", Kind.VARCHAR, "sha256 of the canonical request input."),
        _c("hardware", Kind.VARCHAR, "sha256 fingerprint of the replica's hardware."),
        _c("entry", Kind.VARCHAR, "The canonical JSON the hash covers.", required=True),
        _c("prev_hash", Kind.VARCHAR, "Hash of entry seq-1.", required=True),
        _c("hash", Kind.VARCHAR, "sha256 over prev_hash, seq and entry.", required=True),
    ),
)

TABLES: tuple[Table, ...] = (SPANS, LOGS, METRIC_POINTS, INCIDENTS, ACTIONS, LEDGER,
                             PROVENANCE)
_BY_NAME = {t.name: t for t in TABLES}


def table(name: str) -> Table:
    """The declared table called ``name`` (KeyError if there is none)."""
    return _BY_NAME[name]


def schema_reference() -> str:
    """Markdown description of every table: the source of docs/schema.md."""
    out = [
        "# Telemetry schema",
        "",
        "Generated by `aiops config schema` from `aiops/schema.py`; a test fails when it is stale.",
        "",
    ]
    for t in TABLES:
        out += [f"## `{t.name}`", "", t.doc, "", "| column | type | meaning |", "|---|---|---|"]
        for c in t.columns:
            req = " (required)" if not c.nullable else ""
            shown = "JSON text (VARCHAR)" if c.kind is Kind.JSON else c.kind.duckdb
            out.append(f"| `{c.name}` | `{shown}` | {c.doc}{req} |")
        for d in t.derived:
            out.append(f"| `{d.name}` | `{d.kind.duckdb}` | {d.doc} Derived at ingest. |")
        out.append("")
    return "\n".join(out)

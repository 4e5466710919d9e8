"""What a telemetry row says about the serving it came from, defined once.

Serving code writes these attributes (``serve.telemetry`` for aiops' own stack, the zero-code
exporter of ``aiops.attach.serve_tracing`` for attached apps, vLLM's and the OpenTelemetry SDKs'
own instrumentation for the rest); every reader (the live detectors, the rollout gate, chat-ops,
the dashboards) reads the typed ``spans`` columns the store derives from them once, at ingest,
with the SQL below. So "failed" or "version" cannot mean one thing to the canary gate and
another to the incident detector.

* **model**: the model a request asked for, ``gen_ai.request.model`` (OpenTelemetry GenAI).
* **version**: the release that served it: ``aiops.model.version`` where aiops' serving set one
  (the model's spec version), else the resource's ``service.version`` (any app instrumented with
  an OpenTelemetry SDK; for attached Serve apps, the release of ``aiops.identity``).
* **replica**: the Ray Serve replica id, resource attribute ``ray.serve.replica``. Not the SDK's
  ``service.instance.id``: the SDK makes one per process, and one vLLM server exports from three.
* **http status**: ``http.response.status_code``, or the older ``http.status_code`` that
  instrumentations before semantic conventions 1.21 still write.
* **failed**: the span's status is ``error`` *or* its HTTP status is 5xx. OpenTelemetry's HTTP
  conventions ask servers to set the error status on 5xx, but not every instrumentation (nor
  every proxy span) does; a 5xx is a failure either way. A 4xx is the client's error: not failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from aiops.identity import APP as APP_ATTR
from aiops.identity import DEPLOYMENT as DEPLOYMENT_ATTR
from aiops.identity import INGRESS_SERVICE, SERVICE_VERSION
from aiops.identity import REPLICA as REPLICA_ATTR

__all__ = [
    "APP",
    "CONFIG_DIGEST_ATTR",
    "CONVENTIONS",
    "DECODED_MARK",
    "DEPLOYMENT",
    "FAILED",
    "FAILED_SQL",
    "HTTP_STATUS",
    "HTTP_STATUS_ATTR",
    "HTTP_STATUS_SQL",
    "IDENTITY",
    "INGRESS_SQL",
    "IN_FLIGHT_AGE_METRIC",
    "IN_FLIGHT_RANK_ATTR",
    "MODEL",
    "MODEL_ATTR",
    "MODEL_SQL",
    "MODEL_VERSION_ATTR",
    "NOT_INGRESS_SQL",
    "OLD_HTTP_STATUS_ATTR",
    "OPERATION_ATTR",
    "PRIORITY_ATTR",
    "RAW",
    "RAY_COMPONENT_LABEL",
    "RAY_REPLICA_COMPONENT",
    "REPLICA",
    "REPLICA_ATTR",
    "REPLICA_SQL",
    "ROUTED_VERSION_SQL",
    "SERVICE_VERSION_ATTR",
    "VERSION",
    "VERSION_SQL",
    "VLLM_MODEL_LABEL",
    "WARMUP_ATTR",
    "Source",
    "derivations",
    "failed",
    "http_status",
    "ingest_select",
    "keys",
]

# Attribute names (span attributes unless said).
MODEL_ATTR = "gen_ai.request.model"
MODEL_VERSION_ATTR = "aiops.model.version"
SERVICE_VERSION_ATTR = SERVICE_VERSION  # a resource attribute
HTTP_STATUS_ATTR = "http.response.status_code"
OLD_HTTP_STATUS_ATTR = "http.status_code"
WARMUP_ATTR = "aiops.warmup"  # a replica's warm-up inference: served no user
# The request's priority class at the ingress (realtime, batch): on its span and metrics.
PRIORITY_ATTR = "aiops.priority"

# A digest of the settings a replica runs with that change in place (its user_config): a new
# digest under the same version is a config change, a release of its own (serve.replica).
CONFIG_DIGEST_ATTR = "aiops.model.config_digest"
# Requests still being served: a replica's gauge of the ages (seconds) of its oldest open
# requests per operation (``gen_ai.operation.name``), one series per rank (serve.inflight).
IN_FLIGHT_AGE_METRIC = "aiops.serve.in_flight.age"
IN_FLIGHT_RANK_ATTR = "aiops.in_flight.rank"
OPERATION_ATTR = "gen_ai.operation.name"

# SQL predicates on ``service_name``: rows of aiops' own front door, and rows of anything else.
INGRESS_SQL = f"service_name = '{INGRESS_SERVICE}'"
NOT_INGRESS_SQL = f"service_name <> '{INGRESS_SERVICE}'"

# The typed identity columns every signal table carries (``aiops.schema``), and ``spans``'
# request outcome columns.
MODEL = "model"
VERSION = "model_version"
REPLICA = "replica"
DEPLOYMENT = "deployment"
APP = "app"
HTTP_STATUS = "http_status"
FAILED = "failed"
IDENTITY = (MODEL, VERSION, REPLICA, DEPLOYMENT, APP)

# The label vLLM's own Prometheus series name the model with (``vllm:*``, scraped or remote
# written), and the label Ray's process series name a worker with (``ray::ServeReplica:<app>:
# <deployment>`` for a Serve replica: Ray 2.60's ``ray_component_*`` series carry no other).
VLLM_MODEL_LABEL = "model_name"
RAY_COMPONENT_LABEL = "Component"
RAY_REPLICA_COMPONENT = r"^ray::ServeReplica:([^:]+):(.+)$"  # group 1 the app, 2 the deployment


class Source(NamedTuple):
    """Where a typed column is read: ``attr`` a row attribute, ``resource`` a resource
    attribute, ``component`` a group of ``RAY_REPLICA_COMPONENT`` in Ray's process label."""

    where: str
    key: str


def _a(key: str) -> Source:
    return Source("attr", key)


def _r(key: str) -> Source:
    return Source("resource", key)


_RELEASE = (_a(MODEL_VERSION_ATTR), _r(SERVICE_VERSION_ATTR))
# The conventions table: per signal table, where each identity column is read (first found
# wins). Spans and logs come from OpenTelemetry SDKs, whose resource names the process (a
# Serve replica: its app, deployment and replica). Metric points also come from scrapes and
# remote writes, whose labels are point attributes: the serving code labels each model's
# series, and Ray's and vLLM's own series have labels of their own.
CONVENTIONS: dict[str, dict[str, tuple[Source, ...]]] = {
    "spans": {
        MODEL: (_a(MODEL_ATTR),),
        VERSION: _RELEASE,
        REPLICA: (_r(REPLICA_ATTR),),
        DEPLOYMENT: (_r(DEPLOYMENT_ATTR),),
        APP: (_r(APP_ATTR),),
    },
    "logs": {
        MODEL: (_a(MODEL_ATTR),),
        VERSION: _RELEASE,
        REPLICA: (_r(REPLICA_ATTR),),
        DEPLOYMENT: (_r(DEPLOYMENT_ATTR),),
        APP: (_r(APP_ATTR),),
    },
    "metric_points": {
        MODEL: (_a(MODEL_ATTR), _a(VLLM_MODEL_LABEL)),
        VERSION: _RELEASE,
        REPLICA: (_a(REPLICA_ATTR), _r(REPLICA_ATTR)),
        DEPLOYMENT: (_a(DEPLOYMENT_ATTR), _r(DEPLOYMENT_ATTR), Source("component", "2")),
        APP: (_a(APP_ATTR), _r(APP_ATTR), Source("component", "1")),
    },
}

Accessor = Callable[[str], str]


def _read(sources: tuple[Source, ...], attr: Accessor, resource: Accessor) -> str:
    parts = []
    for s in sources:
        if s.where == "attr":
            parts.append(attr(s.key))
        elif s.where == "resource":
            parts.append(resource(s.key))
        else:
            parts.append(f"nullif(regexp_extract({attr(RAY_COMPONENT_LABEL)}, "
                         f"'{RAY_REPLICA_COMPONENT}', {int(s.key)}), '')")
    return parts[0] if len(parts) == 1 else f"coalesce({', '.join(parts)})"


def derivations(attr: Accessor, resource: Accessor, signal: str = "spans") -> dict[str, str]:
    """Each typed column of ``signal``'s table as SQL, given how to read one row attribute
    (``attr``) and one resource attribute (``resource``) as text: the one definition of
    these meanings."""
    out = {c: _read(sources, attr, resource) for c, sources in CONVENTIONS[signal].items()}
    if signal == "spans":
        status = (f"coalesce(TRY_CAST({attr(HTTP_STATUS_ATTR)} AS INTEGER), "
                  f"TRY_CAST({attr(OLD_HTTP_STATUS_ATTR)} AS INTEGER))")
        out[HTTP_STATUS] = status
        out[FAILED] = (f"(coalesce(status_code = 'error', false) OR "
                       f"coalesce({status} >= 500, false))")
    return out


def _raw(signal: str) -> dict[str, str]:
    """Over a row's raw JSON: how a reader of raw rows (archived Parquet written before the
    columns existed, the migrations for rows stored before) derives each column."""
    return derivations(lambda k: f"(attributes->>'{k}')",
                       lambda k: f"(resource_attributes->>'{k}')", signal)


RAW: dict[str, dict[str, str]] = {signal: _raw(signal) for signal in CONVENTIONS}
MODEL_SQL = RAW["spans"][MODEL]
VERSION_SQL = RAW["spans"][VERSION]
REPLICA_SQL = RAW["spans"][REPLICA]
HTTP_STATUS_SQL = RAW["spans"][HTTP_STATUS]
FAILED_SQL = RAW["spans"][FAILED]
# On aiops' ingress, the model version a request was routed to (NULL before routing: the
# ingress's own ``service.version`` is its release, not a model's).
ROUTED_VERSION_SQL = f"(attributes->>'{MODEL_VERSION_ATTR}')"

# Arrow schema metadata (key, value) of a spans batch whose OTLP decoder derived the columns
# itself, as ``ingest_select`` would from the same row (collectors/otlp/derive.py, _wire.pyx):
# the store inserts those as given. Derived columns without it are recomputed.
DECODED_MARK = (b"aiops.derived", b"semconv")


def keys(signal: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(row attribute keys, resource attribute keys) ``signal``'s typed columns read."""
    attr: list[str] = []
    resource: list[str] = []
    for sources in CONVENTIONS[signal].values():
        for s in sources:
            key = RAY_COMPONENT_LABEL if s.where == "component" else s.key
            into = resource if s.where == "resource" else attr
            if key not in into:
                into.append(key)
    if signal == "spans":
        attr += [HTTP_STATUS_ATTR, OLD_HTTP_STATUS_ATTR]
    return tuple(attr), tuple(resource)


def ingest_select(signal: str) -> Callable[[str, tuple[str, ...]], str]:
    """How the store inserts ``signal``'s rows: ``SELECT`` of a source's columns followed by
    the derived ``columns``, each JSON map parsed once for every key (``->>`` per key parses
    it per key; on the spans ingest path that was ~0.7 us a span against ~0.5)."""
    attr_keys, resource_keys = keys(signal)
    slot = {k: f"_a[{i}]" for i, k in enumerate(attr_keys, 1)}
    rslot = {k: f"_r[{i}]" for i, k in enumerate(resource_keys, 1)}
    d = derivations(slot.__getitem__, rslot.__getitem__, signal)
    paths = ", ".join(f"'$.\"{k}\"'" for k in attr_keys)
    rpaths = ", ".join(f"'$.\"{k}\"'" for k in resource_keys)

    def select(source: str, columns: tuple[str, ...]) -> str:
        return (f"SELECT * EXCLUDE (_a, _r), {', '.join(d[c] for c in columns)} FROM ("
                f"SELECT *, json_extract_string(attributes, [{paths}]) AS _a, "
                f"json_extract_string(resource_attributes, [{rpaths}]) AS _r FROM {source})")
    return select


def http_status(attributes: dict[str, object]) -> int | None:
    """The HTTP status a span's attributes record, as ``HTTP_STATUS_SQL`` reads it."""
    for key in (HTTP_STATUS_ATTR, OLD_HTTP_STATUS_ATTR):
        value = attributes.get(key)
        if value is None:
            continue
        try:
            return int(str(value))
        except ValueError:
            continue
    return None


def failed(status_code: str | None, status: int | None) -> bool:
    """Whether a span with this status code and HTTP status failed, as ``FAILED_SQL``."""
    return status_code == "error" or (status is not None and status >= 500)

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

from aiops.identity import INGRESS_SERVICE
from aiops.identity import REPLICA as REPLICA_ATTR

__all__ = [
    "CONFIG_DIGEST_ATTR",
    "DECODED_MARK",
    "FAILED",
    "FAILED_SQL",
    "HTTP_STATUS",
    "HTTP_STATUS_ATTR",
    "HTTP_STATUS_SQL",
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
    "REPLICA",
    "REPLICA_ATTR",
    "REPLICA_SQL",
    "ROUTED_VERSION_SQL",
    "SERVICE_VERSION_ATTR",
    "VERSION",
    "VERSION_SQL",
    "WARMUP_ATTR",
    "derivations",
    "failed",
    "http_status",
    "ingest_select",
]

# Attribute names (span attributes unless said).
MODEL_ATTR = "gen_ai.request.model"
MODEL_VERSION_ATTR = "aiops.model.version"
SERVICE_VERSION_ATTR = "service.version"  # a resource attribute
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

# The typed columns of ``spans`` that carry these meanings (``aiops.schema.SPANS``).
MODEL = "model"
VERSION = "model_version"
REPLICA = "replica"
HTTP_STATUS = "http_status"
FAILED = "failed"

Accessor = Callable[[str], str]


def derivations(attr: Accessor, resource: Accessor) -> dict[str, str]:
    """Each typed column as SQL, given how to read one span attribute (``attr``) and one
    resource attribute (``resource``) as text: the one definition of these meanings."""
    status = (f"coalesce(TRY_CAST({attr(HTTP_STATUS_ATTR)} AS INTEGER), "
              f"TRY_CAST({attr(OLD_HTTP_STATUS_ATTR)} AS INTEGER))")
    return {
        MODEL: attr(MODEL_ATTR),
        VERSION: f"coalesce({attr(MODEL_VERSION_ATTR)}, {resource(SERVICE_VERSION_ATTR)})",
        REPLICA: resource(REPLICA_ATTR),
        HTTP_STATUS: status,
        FAILED: f"(coalesce(status_code = 'error', false) OR coalesce({status} >= 500, false))",
    }


# Over a row's raw JSON: how a reader of raw rows (archived Parquet written before the columns
# existed, migration 9 for rows stored before) derives each column.
_RAW = derivations(lambda k: f"(attributes->>'{k}')", lambda k: f"(resource_attributes->>'{k}')")
MODEL_SQL = _RAW[MODEL]
VERSION_SQL = _RAW[VERSION]
REPLICA_SQL = _RAW[REPLICA]
HTTP_STATUS_SQL = _RAW[HTTP_STATUS]
FAILED_SQL = _RAW[FAILED]
# On aiops' ingress, the model version a request was routed to (NULL before routing: the
# ingress's own ``service.version`` is its release, not a model's).
ROUTED_VERSION_SQL = f"(attributes->>'{MODEL_VERSION_ATTR}')"

# Arrow schema metadata (key, value) of a spans batch whose OTLP decoder derived the columns
# itself, as ``ingest_select`` would from the same row (collectors/otlp/derive.py, _wire.pyx):
# the store inserts those as given. Derived columns without it are recomputed.
DECODED_MARK = (b"aiops.derived", b"semconv")

_SPAN_KEYS = (MODEL_ATTR, MODEL_VERSION_ATTR, HTTP_STATUS_ATTR, OLD_HTTP_STATUS_ATTR)
_RESOURCE_KEYS = (SERVICE_VERSION_ATTR, REPLICA_ATTR)


def ingest_select(source: str, columns: tuple[str, ...]) -> str:
    """``SELECT`` of ``source``'s columns followed by ``columns`` derived, as the store inserts
    spans: each JSON map is parsed once for every key (``->>`` per key parses it per key; on
    the ingest path that was ~0.7 us a span against ~0.5)."""
    slot = {k: f"_a[{i}]" for i, k in enumerate(_SPAN_KEYS, 1)}
    rslot = {k: f"_r[{i}]" for i, k in enumerate(_RESOURCE_KEYS, 1)}
    d = derivations(slot.__getitem__, rslot.__getitem__)
    paths = ", ".join(f"'$.\"{k}\"'" for k in _SPAN_KEYS)
    rpaths = ", ".join(f"'$.\"{k}\"'" for k in _RESOURCE_KEYS)
    return (f"SELECT * EXCLUDE (_a, _r), {', '.join(d[c] for c in columns)} FROM ("
            f"SELECT *, json_extract_string(attributes, [{paths}]) AS _a, "
            f"json_extract_string(resource_attributes, [{rpaths}]) AS _r FROM {source})")


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

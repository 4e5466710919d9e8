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

from aiops.identity import REPLICA as REPLICA_ATTR

__all__ = ["FAILED", "FAILED_SQL", "HTTP_STATUS", "HTTP_STATUS_ATTR", "HTTP_STATUS_SQL", "MODEL",
           "MODEL_ATTR", "MODEL_SQL", "MODEL_VERSION_ATTR", "REPLICA", "REPLICA_ATTR",
           "REPLICA_SQL", "ROUTED_VERSION_SQL", "SERVICE_VERSION_ATTR", "VERSION", "VERSION_SQL",
           "WARMUP_ATTR", "failed", "http_status"]

# Attribute names (span attributes unless said).
MODEL_ATTR = "gen_ai.request.model"
MODEL_VERSION_ATTR = "aiops.model.version"
SERVICE_VERSION_ATTR = "service.version"  # a resource attribute
HTTP_STATUS_ATTR = "http.response.status_code"
OLD_HTTP_STATUS_ATTR = "http.status_code"
WARMUP_ATTR = "aiops.warmup"  # a replica's warm-up inference: served no user

# The typed columns of ``spans`` that carry these meanings (``aiops.schema.SPANS``).
MODEL = "model"
VERSION = "model_version"
REPLICA = "replica"
HTTP_STATUS = "http_status"
FAILED = "failed"

# How the store derives each column from a span's raw JSON at ingest (and how a reader of raw
# rows, e.g. archived Parquet written before the columns existed, derives it).
MODEL_SQL = f"attributes->>'{MODEL_ATTR}'"
VERSION_SQL = (f"coalesce(attributes->>'{MODEL_VERSION_ATTR}', "
               f"resource_attributes->>'{SERVICE_VERSION_ATTR}')")
REPLICA_SQL = f"resource_attributes->>'{REPLICA_ATTR}'"
# On aiops' ingress, the model version a request was routed to (NULL before routing: the
# ingress's own ``service.version`` is its release, not a model's).
ROUTED_VERSION_SQL = f"attributes->>'{MODEL_VERSION_ATTR}'"
HTTP_STATUS_SQL = (f"coalesce(TRY_CAST(attributes->>'{HTTP_STATUS_ATTR}' AS INTEGER), "
                   f"TRY_CAST(attributes->>'{OLD_HTTP_STATUS_ATTR}' AS INTEGER))")
FAILED_SQL = (f"(coalesce(status_code = 'error', false) "
              f"OR coalesce({HTTP_STATUS_SQL} >= 500, false))")


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

"""Zero-code tracing of a team's Ray Serve application: Serve's own spans, exported to aiops
with the names aiops acts on.

Ray Serve traces every request itself once a tracing exporter is configured: the HTTP proxy
(``proxy_http_request``), each call through a ``DeploymentHandle`` (``route_to_replica``, in
the caller) and each replica's handling of it (``replica_handle_request <deployment>
<method>``), with the W3C trace context carried across them. What it lacks for aiops is who a
span is (its process' resource names no application, deployment or release), a client kind on
handle calls and an error status on a failed replica call. This module is the exporter a team
points Serve at; it fills those in and sends the spans over OTLP/HTTP. The app's code does not
change; the Serve config does (docs/attach.md)::

    tracing_config:
      enabled: true
      exporter_import_path: aiops.attach.serve_tracing:span_processors
      sampling_ratio: 1.0

with ``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_EXPORTER_OTLP_HEADERS`` (an ingest token) in the
app's ``runtime_env.env_vars``. Serve reads ``tracing_config`` in replicas; its HTTP proxies read
``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH`` / ``RAY_SERVE_TRACING_SAMPLING_RATIO`` (and the OTLP
variables) from ``ray start``'s environment, where the team wants the proxies' spans too.

Names follow ``aiops.identity``: a replica asks the Serve controller for its application's
deployed config (the same answer the Serve REST API gives aiops) and computes its deployment's
service and version by the same rules the server uses, so a span and the config that deployed
it name the same release. While the application is deploying, a replica keeps the version it
started with (old and new replicas then serve side by side, each under its own release).

This module runs inside the team's replicas: it imports only the OpenTelemetry SDK, Ray and
``aiops.identity``, and it never raises into Serve (an export it cannot do is logged and dropped,
as the SDK's own exporters do).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from aiops.identity import APP, DEPLOYMENT, REPLICA, identities

__all__ = ["PROXY_SERVICE", "ServeSpanExporter", "span_processors"]

log = logging.getLogger(__name__)

# The service of the proxies' spans: the clients' view of every application on the node.
PROXY_SERVICE = "ray-serve-proxy"
# How often a replica re-reads its release once its application runs; while it deploys, every
# UNSETTLED_S for UNSETTLED_FOR_S (then REFRESH_S: an app can stay unhealthy for long).
REFRESH_S = 15.0
UNSETTLED_S, UNSETTLED_FOR_S = 2.0, 120.0
DEFAULT_DELAY_MS = 500.0
_HANDLE_CALL = "route_to_replica"
_SERVE_SCOPE = "ray.serve"  # the tracer Serve's own spans come from
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def span_processors() -> list[SpanProcessor]:
    """Serve's exporter hook (``exporter_import_path``): takes no argument, returns the span
    processors of this process' tracer provider. Serve calls it while a replica starts, so
    nothing here may fail the replica: a problem is logged and nothing is exported."""
    if not any(os.environ.get(v) for v in _ENDPOINT_VARS):
        log.warning("aiops tracing: no OTEL_EXPORTER_OTLP_ENDPOINT in this process' environment "
                    "(pid %d): Serve's spans are not exported", os.getpid())
        return []
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # A short delay: detection and verification read these spans within seconds.
        return [BatchSpanProcessor(ServeSpanExporter(OTLPSpanExporter()),
                                   schedule_delay_millis=_delay_ms())]
    except Exception:
        log.exception("aiops tracing: cannot set up the OTLP exporter; Serve's spans are not "
                      "exported")
        return []


def _delay_ms() -> float:
    raw = os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "")
    try:
        return max(1.0, float(raw)) if raw else DEFAULT_DELAY_MS
    except ValueError:
        log.warning("aiops tracing: OTEL_BSP_SCHEDULE_DELAY=%r is not a number of "
                    "milliseconds; using %g", raw, DEFAULT_DELAY_MS)
        return DEFAULT_DELAY_MS


class _Whoami:
    """This process' Serve identity as resource attributes, re-read while it may change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attrs: dict[str, Any] | None = None
        self._read_at = 0.0
        self._settled = False  # the app was RUNNING when last read
        self._unsettled_since = time.monotonic()

    def attributes(self) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            quick = not self._settled and now - self._unsettled_since < UNSETTLED_FOR_S
            if self._attrs is None or now - self._read_at > (UNSETTLED_S if quick
                                                             else REFRESH_S):
                self._attrs = self._read(self._attrs)
                self._read_at = now
                if self._settled:
                    self._unsettled_since = now
            return self._attrs

    def _read(self, before: dict[str, Any] | None) -> dict[str, Any]:
        try:
            from ray import serve
            from ray.serve.exceptions import RayServeException
        except ImportError:  # pragma: no cover - Serve calls this module
            return {"service.name": PROXY_SERVICE}
        try:
            ctx = serve.get_replica_context()
        except RayServeException:  # a proxy, or a process that is not a replica
            self._settled = True
            return {"service.name": PROXY_SERVICE}
        app, deployment = ctx.app_name, ctx.deployment
        attrs: dict[str, Any] = {
            APP: app, DEPLOYMENT: deployment, REPLICA: ctx.replica_id.unique_id,
            "service.instance.id": ctx.replica_id.unique_id,
            # Until the controller answers: the app's own setting, else Serve's names.
            "service.name": (before or {}).get("service.name")
            or os.environ.get("OTEL_SERVICE_NAME") or f"{app}.{deployment}",
        }
        try:
            import ray
            from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            details = cast(dict[str, Any], ray.get(
                controller.get_serve_instance_details.remote(), timeout=10))
            app_details = (details.get("applications") or {}).get(app) or {}
            ident = identities(app, app_details).get(deployment)
        except Exception as exc:  # noqa: BLE001 - never raise into Serve; keep what we had
            log.warning("aiops tracing: cannot read application %s from the Serve "
                        "controller: %s", app, exc)
            self._settled = False
            return {**attrs, **{k: v for k, v in (before or {}).items()
                                if k in ("service.name", "service.version")}}
        running = app_details.get("status") == "RUNNING"
        if ident is not None:
            attrs["service.name"] = ident.service
            # A replica started for this release keeps it while the app still deploys.
            keep = before is not None and not running and before.get("service.version")
            attrs["service.version"] = keep or ident.version
        self._settled = running and ident is not None
        return attrs


class ServeSpanExporter(SpanExporter):
    """Serve's spans, renamed to the Serve entity that made them, to the wrapped exporter."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._whoami = _Whoami()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            attrs = self._whoami.attributes()
            # One process, one resource: merged once per batch, not once per span.
            merged: dict[int, Resource] = {}
            out = [_rewrite(s, attrs, merged) for s in spans]
        except Exception:
            log.exception("aiops tracing: cannot rewrite %d spans; sent as Serve made them",
                          len(spans))
            out = list(spans)
        return self._inner.export(out)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _failed(span: ReadableSpan) -> str | None:
    """Why a span of Serve's failed, or None: an exception it recorded (a cancelled request
    is the client's doing, not a failure) or an HTTP status of 500 or more."""
    status = (span.attributes or {}).get("http.status_code")
    try:
        if status is not None and int(str(status)) >= 500:
            return f"HTTP {status}"
    except ValueError:
        pass
    for event in span.events:
        if event.name == "exception":
            kind = str((event.attributes or {}).get("exception.type", ""))
            if kind and "Cancelled" not in kind:
                return kind
    return None


def _serves(span: ReadableSpan) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name.startswith(_SERVE_SCOPE)


def _rewrite(span: ReadableSpan, identity: dict[str, Any],
             merged: dict[int, Resource] | None = None) -> ReadableSpan:
    cache = {} if merged is None else merged
    key = id(span.resource)
    resource = cache.get(key)
    if resource is None:
        resource = cache[key] = span.resource.merge(Resource(identity)) if span.resource \
            else Resource(identity)
    attrs = dict(span.attributes or {})
    status = span.status
    why = _failed(span)
    if why is not None and status.status_code is StatusCode.UNSET:
        status = Status(StatusCode.ERROR, why)
        attrs.setdefault("error.type", why)
    code = attrs.get("http.status_code")
    if code is not None and "http.response.status_code" not in attrs:
        with contextlib.suppress(ValueError):
            attrs["http.response.status_code"] = int(str(code))
    kind = span.kind
    if span.name.startswith(_HANDLE_CALL):
        kind = SpanKind.CLIENT
    elif kind is SpanKind.SERVER and REPLICA in identity and not _serves(span):
        # In a replica the request is Serve's span; a web framework's own server span (FastAPI
        # traces itself) is a step inside it, or each request would count twice.
        kind = SpanKind.INTERNAL
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=resource,
        attributes=attrs, events=span.events, links=span.links, kind=kind, status=status,
        start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)

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

from aiops.identity import APP, DEPLOYMENT, PROXY_SERVICE, REPLICA, SCALING_FIELDS, identities
from aiops.semconv import SERVICE_VERSION_ATTR

__all__ = ["PROXY_SERVICE", "ReleaseStamp", "ServeSpanExporter", "span_processors"]

log = logging.getLogger(__name__)

# How often a replica re-reads its release once its application runs; while it deploys, every
# UNSETTLED_S for UNSETTLED_FOR_S (then REFRESH_S: an app can stay unhealthy for long).
REFRESH_S = 15.0
UNSETTLED_S, UNSETTLED_FOR_S = 2.0, 120.0
DEFAULT_DELAY_MS = 500.0
_HANDLE_CALL = "route_to_replica"
_PROXY_HTTP = "proxy_http_request"
# Internal: the release epoch a span started in (ReleaseStamp); never leaves the process.
_EPOCH = "aiops.serve.release_epoch"
_ENDED_MAX = 4096
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

        exporter = ServeSpanExporter(OTLPSpanExporter())
        # The stamp first: a span carries the release it started under. A short delay:
        # detection and verification read these spans within seconds.
        return [ReleaseStamp(exporter.whoami),
                BatchSpanProcessor(exporter, schedule_delay_millis=_delay_ms())]
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


def _replica_context() -> Any:
    """This process' Serve replica context (None outside a replica: a proxy). Serve replaces
    the object whenever it reconfigures the replica (a ``user_config`` release applied in
    place), so its identity says when the release may have changed. A module attribute read:
    cheap enough for every span's start."""
    try:
        from ray.serve.context import _get_internal_replica_context
    except ImportError:  # pragma: no cover - Serve calls this module
        return None
    return _get_internal_replica_context()  # type: ignore[no-untyped-call]


def _release_key(ctx: Any, live: Any = None) -> str:
    """What a replica runs: its deployment config without the scaling fields (``user_config``
    among the rest) and its code version, read from the live replica where there is one (see
    ``_live_replica``), else from its context. Equal keys, same release."""
    src = live if live is not None else ctx
    cfg = getattr(src, "_deployment_config", None)
    try:
        body = cfg.dict(exclude=set(SCALING_FIELDS) | {"user_configured_option_names"}) \
            if cfg is not None else None
    except Exception:  # noqa: BLE001 - a Serve that changed the model: compare what we can
        body = getattr(cfg, "user_config", None)
    code = getattr(getattr(live, "_version", None), "code_version", None) if live is not None \
        else getattr(ctx, "code_version", None)
    return repr((body, code))


def _live_replica(ctx: Any) -> Any:
    """The replica object behind a context, or None. Serve sets a replica's new
    ``_deployment_config`` *before* it calls the app's ``reconfigure()`` and replaces the
    context only after (ray/serve/_private/replica.py ``reconfigure``): a request that starts
    between the two already runs the new ``user_config`` under the old context. The context's
    handle-registration callback closes over the replica; read through it, the release is
    known from the moment the app can act on it. Where Serve changes that shape: None, and
    the context alone is read."""
    callback = getattr(ctx, "_handle_registration_callback", None)
    for cell in getattr(callback, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            obj = cell.cell_contents
            if hasattr(obj, "_deployment_config") and hasattr(obj, "_version"):
                return obj
    return None


class _Whoami:
    """This process' Serve identity as resource attributes, per release *epoch*.

    A replica's epoch changes when Serve reconfigures it with a different release (a
    ``user_config`` change applies in place, in this process): ``epoch()`` notices at the
    next span's start, so each span is stamped with the release it started under, and the
    first export after the change reads the new release from the controller (which holds the
    new config before it reconfigures any replica). Within an epoch the release is re-read
    while the application may change elsewhere (another deployment's release renames this
    one's too): every REFRESH_S once it runs, every UNSETTLED_S while it deploys."""

    def __init__(self, context: Any = _replica_context) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._attrs: dict[str, Any] | None = None  # the current epoch's, once read
        self._by_epoch: dict[int, dict[str, Any]] = {}
        self._ended: dict[int, int] = {}  # span id -> epoch it ended in (ReleaseStamp)
        self._ctx: Any = None
        self._live: Any = None  # the replica behind self._ctx (None: read the context)
        self._cfg: Any = None  # the live replica's deployment config object last keyed
        self._key: str | None = None
        self._epoch = 0
        self._read_epoch = -1  # the epoch _attrs was read for
        self._read_at = 0.0
        self._settled = False  # the app was RUNNING when last read
        self._unsettled_since = time.monotonic()

    def epoch(self) -> int | None:
        """The release epoch this replica runs now (None outside a replica)."""
        ctx = self._context()
        if ctx is None:
            return None
        if ctx is not self._ctx:
            self._live = _live_replica(ctx)
        cfg = getattr(self._live, "_deployment_config", None)
        if ctx is self._ctx and cfg is self._cfg:
            return self._epoch
        key = _release_key(ctx, self._live)
        with self._lock:
            if ctx is not self._ctx or cfg is not self._cfg:
                self._ctx, self._cfg = ctx, cfg
                if key != self._key:
                    self._key, self._epoch = key, self._epoch + 1
            return self._epoch

    def note_ended(self, span_id: int, epoch: int) -> None:
        """A span ended in ``epoch``, another than it started in (rare: only spans in flight
        across an in-place release; bounded in case such a span is never exported)."""
        with self._lock:
            self._ended[span_id] = epoch
            while len(self._ended) > _ENDED_MAX:
                self._ended.pop(next(iter(self._ended)))

    def ended(self, span_id: int) -> int | None:
        """The epoch a span ended in where it differs from its start's; forgotten once read."""
        if not self._ended:
            return None
        with self._lock:
            return self._ended.pop(span_id, None)

    def attributes(self, epoch: int | None = None) -> dict[str, Any]:
        """The resource attributes of spans started in ``epoch`` (None: now)."""
        with self._lock:
            if epoch is not None and epoch < self._epoch:
                old = self._by_epoch.get(epoch)
                if old is not None:
                    return old
            now = time.monotonic()
            changed = self._read_epoch != self._epoch  # reconfigured since the last read
            quick = not self._settled and now - self._unsettled_since < UNSETTLED_FOR_S
            if self._attrs is None or changed or \
                    now - self._read_at > (UNSETTLED_S if quick else REFRESH_S):
                self._attrs = self._read(self._attrs, keep_version=not changed)
                self._read_at, self._read_epoch = now, self._epoch
                if self._settled or changed:
                    self._unsettled_since = now
                self._by_epoch[self._epoch] = self._attrs
                for stale in sorted(self._by_epoch)[:-8]:
                    del self._by_epoch[stale]
            return self._attrs

    def _read(self, before: dict[str, Any] | None, keep_version: bool = True
              ) -> dict[str, Any]:
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
                                if k in ("service.name", SERVICE_VERSION_ATTR)}}
        running = app_details.get("status") == "RUNNING"
        if ident is not None:
            attrs["service.name"] = ident.service
            # A replica started for this release keeps it while the app still deploys (its
            # successors serve the next one); one reconfigured in place runs the new one.
            keep = keep_version and before is not None and not running \
                and before.get(SERVICE_VERSION_ATTR)
            attrs[SERVICE_VERSION_ATTR] = keep or ident.version
        self._settled = running and ident is not None
        return attrs


class ReleaseStamp(SpanProcessor):
    """Stamps each span, as it starts, with its replica's release epoch (``_Whoami.epoch``):
    a request that began before an in-place release is the old release's, one that began
    after is the new one's, whenever their batch is exported. A span that ends in another
    epoch than it started (in flight across an in-place release) is noted: if it failed, the
    failure was raised by the release that ran when it ended (``_Whoami.ended``)."""

    def __init__(self, whoami: _Whoami) -> None:
        self._whoami = whoami

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            epoch = self._whoami.epoch()
            if epoch is not None:
                span.set_attribute(_EPOCH, epoch)
        except Exception:  # the hot path never raises into Serve
            log.debug("aiops tracing: cannot stamp a span's release", exc_info=True)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            started = (span.attributes or {}).get(_EPOCH)
            if isinstance(started, int):
                now = self._whoami.epoch()
                if now is not None and now != started and span.context is not None:
                    self._whoami.note_ended(span.context.span_id, now)
        except Exception:  # the hot path never raises into Serve
            log.debug("aiops tracing: cannot note a span's end release", exc_info=True)


class ServeSpanExporter(SpanExporter):
    """Serve's spans, renamed to the Serve entity that made them, to the wrapped exporter."""

    def __init__(self, inner: SpanExporter, whoami: _Whoami | None = None) -> None:
        self._inner = inner
        self.whoami = whoami or _Whoami()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            identity: dict[int | None, dict[str, Any]] = {}
            # One resource per process and release: merged once per batch, not once per span.
            merged: dict[tuple[int, int | None], Resource] = {}
            out = []
            for span in spans:
                raw = (span.attributes or {}).get(_EPOCH)
                epoch = raw if isinstance(raw, int) else None
                ended = self.whoami.ended(span.context.span_id) if span.context else None
                if ended is not None and _fails(span):
                    epoch = ended
                if epoch not in identity:
                    identity[epoch] = self.whoami.attributes(epoch)
                out.append(_rewrite(span, identity[epoch], merged, epoch))
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


def _fails(span: ReadableSpan) -> bool:
    return span.status.status_code is StatusCode.ERROR or _failed(span) is not None


def _serves(span: ReadableSpan) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name.startswith(_SERVE_SCOPE)


def _rewrite(span: ReadableSpan, identity: dict[str, Any],
             merged: dict[tuple[int, int | None], Resource] | None = None,
             epoch: int | None = None) -> ReadableSpan:
    cache = {} if merged is None else merged
    key = (id(span.resource), epoch)
    resource = cache.get(key)
    if resource is None:
        resource = cache[key] = span.resource.merge(Resource(identity)) if span.resource \
            else Resource(identity)
    attrs = dict(span.attributes or {})
    attrs.pop(_EPOCH, None)
    name = span.name
    if name.startswith(_PROXY_HTTP + " "):
        # Serve names a proxy span "<kind> <ingress deployment> <method> <raw path>": one name
        # per URL. Named by route (the application's ingress and the method) instead, the
        # path kept as ``url.path``: a route's requests are one operation to judge.
        parts = name.split(" ", 3)
        if len(parts) == 4:
            name = " ".join(parts[:3])
            attrs.setdefault("url.path", parts[3])
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
        name=name, context=span.context, parent=span.parent, resource=resource,
        attributes=attrs, events=span.events, links=span.links, kind=kind, status=status,
        start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)

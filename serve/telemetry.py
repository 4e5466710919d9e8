"""OpenTelemetry for Serve replicas: spans, logs and metrics exported by OTLP/HTTP.

Each replica builds its own providers (no process-global state, so tests and several
components in one process don't collide) and shuts them down with the replica. W3C trace
context crosses the ingress -> model hop in a plain dict carrier.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import requests
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.logging.handler import LoggingHandler
from opentelemetry.metrics import Meter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider, TraceBasedExemplarFilter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from aiops import identity, semconv
from aiops.semconv import PRIORITY_ATTR

__all__ = ["Telemetry", "TelemetryConfig", "attrs", "extract_context", "inject_context"]

_PROPAGATOR = TraceContextTextMapPropagator()


class attrs:  # noqa: N801 - a namespace of constants
    """Attribute names: OpenTelemetry semantic conventions where they exist."""

    SERVICE_NAME = "service.name"
    SERVICE_VERSION = semconv.SERVICE_VERSION_ATTR
    SERVICE_INSTANCE_ID = "service.instance.id"
    GEN_AI_OPERATION = "gen_ai.operation.name"
    GEN_AI_SYSTEM = "gen_ai.system"
    GEN_AI_REQUEST_MODEL = semconv.MODEL_ATTR
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
    GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
    GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
    HTTP_METHOD = "http.request.method"
    HTTP_ROUTE = "http.route"
    HTTP_STATUS = "http.response.status_code"
    MODEL_VERSION = semconv.MODEL_VERSION_ATTR
    ARTIFACT_DIGEST = "aiops.model.artifact_digest"
    INFERENCE_ID = "inference_id"
    SERVE_APP = identity.APP
    SERVE_DEPLOYMENT = identity.DEPLOYMENT
    SERVE_REPLICA = identity.REPLICA
    PRIORITY = PRIORITY_ATTR


@dataclass(frozen=True)
class TelemetryConfig:
    endpoint: str
    """Base URL of the OTLP/HTTP receiver, e.g. http://127.0.0.1:4318."""
    export_interval_s: float = 1.0
    provenance: bool = True
    """Emit one provenance record per inference (the server chains them)."""
    certificate_file: str | None = None
    """CA bundle to verify an https receiver against; None: the system's trust store."""
    token: str | None = None
    """Bearer token sent with every export (the serving stack's own ingest credential,
    which alone may write provenance); None: anonymous (loopback only)."""


class _PinnedCaSession(requests.Session):
    """A session whose ``verify`` (the configured CA) wins over the environment: plain
    requests lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` override a session's ``verify``
    (psf/requests#3829), which would silently drop the configured CA. Proxies and the rest
    of the environment still apply."""

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        merged: dict[str, Any] = super().merge_environment_settings(
            url, proxies, stream, verify, cert)
        merged["verify"] = self.verify
        return merged


def _session(certificate_file: str | None) -> requests.Session | None:
    """The exporters' HTTP session: with a CA file, one that keeps it (see above)."""
    return _PinnedCaSession() if certificate_file is not None else None


# Histogram bucket bounds in the unit recorded, as OpenTelemetry's GenAI and HTTP semantic
# conventions advise. Without them the SDK's default bounds (0, 5, 10, 25, ... 10000: made for
# milliseconds) put every value in seconds in the first bucket, and no percentile can be read.
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                      40.96, 81.92)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
HTTP_DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                           7.5, 10.0)


class Telemetry:
    """Tracer, meter and an OTel-bridged logger for one component."""

    def __init__(self, config: TelemetryConfig, resource: Mapping[str, str], component: str):
        res = Resource.create(dict(resource))
        interval_ms = int(config.export_interval_s * 1000)
        base = config.endpoint.rstrip("/")
        ca = config.certificate_file
        headers = {"authorization": f"Bearer {config.token}"} if config.token else None
        self.tracer_provider = TracerProvider(resource=res)
        # A larger queue than the default 2048: a burst must not silently drop spans.
        self.tracer_provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{base}/v1/traces", certificate_file=ca,
                             session=_session(ca), headers=headers),
            schedule_delay_millis=interval_ms, max_queue_size=65536))
        self.logger_provider = LoggerProvider(resource=res)
        self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(
            OTLPLogExporter(endpoint=f"{base}/v1/logs", certificate_file=ca,
                            session=_session(ca), headers=headers),
            schedule_delay_millis=interval_ms, max_queue_size=65536))
        # Trace-based exemplars tie histogram points to the request that produced them.
        self.meter_provider = MeterProvider(
            resource=res, exemplar_filter=TraceBasedExemplarFilter(), metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics",
                                                             certificate_file=ca,
                                                             session=_session(ca),
                                                             headers=headers),
                                          export_interval_millis=interval_ms)])
        self.tracer: Tracer = self.tracer_provider.get_tracer("aiops.serve")
        self.meter: Meter = self.meter_provider.get_meter("aiops.serve")
        self.logger = logging.getLogger(f"aiops.serve.{component}")
        self.logger.setLevel(logging.INFO)
        self._handler = LoggingHandler(logger_provider=self.logger_provider)
        self.logger.addHandler(self._handler)

    def flush(self, timeout_ms: int = 10_000) -> None:
        self.tracer_provider.force_flush(timeout_ms)
        self.logger_provider.force_flush(timeout_ms)
        self.meter_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.logger.removeHandler(self._handler)
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()


def extract_context(carrier: Mapping[str, str]) -> Context:
    return _PROPAGATOR.extract(carrier=carrier)


def inject_context(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    _PROPAGATOR.inject(carrier, context=context)

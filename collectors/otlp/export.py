"""One OTLP export, whatever carried it (HTTP on 4318, gRPC on 4317): decode the body, bind its
rows to the caller's credential, keep provenance records to the serving stack's credential,
commit through the store writer and answer with the export response (``partial_success`` for
what was left out). Each transport maps the typed errors below to its own status codes."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.concurrency import run_in_threadpool

from aiops.auth import Principal
from collectors.otlp.credential import stamp
from collectors.otlp.decode import decode
from collectors.otlp.provenance import split_provenance
from collectors.otlp.writer import BatchWriter, MemoryBudget

__all__ = ["PROVENANCE_DENIED", "SIGNALS", "WORKING_SET_FACTOR", "Charge", "ReceiverMetrics",
           "export"]

SIGNALS = ("traces", "logs", "metrics")
_RESPONSES: dict[str, type[Message]] = {
    "traces": ExportTraceServiceResponse,
    "logs": ExportLogsServiceResponse,
    "metrics": ExportMetricsServiceResponse,
}
_REJECTED_FIELD = {"traces": "rejected_spans", "logs": "rejected_log_records",
                   "metrics": "rejected_data_points"}
# Peak memory of decoding a request, in multiples of its (uncompressed) body: ~10x measured
# for 20k-span requests (Python strings per cell, then Arrow buffers).
WORKING_SET_FACTOR = 12
PROVENANCE_DENIED = "provenance records need the serving stack's credential"


class Charge:
    """What one request holds of the ingest budget: the bytes of its body as they arrive,
    then its decoding working set; all of it goes back with ``release``. Counted against the
    request's source address and, for a named caller, its principal (a token's share is the
    same from every address)."""

    def __init__(self, budget: MemoryBudget, principal: str = "", source: str = "") -> None:
        self.budget, self.source = budget, source
        self.principal = "" if principal in ("", "?", "anonymous") else principal
        self.held = 0

    def add(self, n: int) -> None:
        self.budget.acquire(n, held=self.held, source=self.source, principal=self.principal)
        self.held += n

    def grow_to(self, n: int) -> None:
        if n > self.held:
            self.add(n - self.held)

    def shrink_to(self, n: int) -> None:
        """Give back what is held over ``n`` (a reservation trued up to what arrived)."""
        if n < self.held:
            self.budget.release(self.held - n, self.source, self.principal)
            self.held = n

    def release(self) -> None:
        if self.held:
            self.budget.release(self.held, self.source, self.principal)
            self.held = 0


class ReceiverMetrics:
    """The receivers' Prometheus series; ``transport`` tells HTTP from gRPC, ``code`` is the
    HTTP status or the gRPC status name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("aiops_otlp_requests", "OTLP export requests by signal, "
                                "transport and status", ["signal", "transport", "code"],
                                registry=registry)
        self.rows = Counter("aiops_otlp_rows", "Rows committed from OTLP", ["table"],
                            registry=registry)
        self.seconds = Histogram("aiops_otlp_request_seconds", "Time to decode and commit one "
                                 "OTLP request", ["signal", "transport"], registry=registry)
        self.rejected = Counter("aiops_otlp_rejected_records", "Records left out of accepted "
                                "requests (partial success)", ["signal"], registry=registry)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ReceiverMetrics:
        return cls(registry)


async def export(signal: str, body: bytes, encoding: str, principal: Principal | None,
                 writer: BatchWriter, charge: Charge, metrics: ReceiverMetrics) -> Message:
    """Decode and commit one export request's (uncompressed) ``body``; the response message.
    Raises DecodeError, Overloaded, Unstorable or StoreError (aiops.errors, writer)."""
    # The decoding working set (column lists of Python objects, then Arrow), measured at
    # about WORKING_SET_FACTOR x the (uncompressed) body.
    charge.grow_to(WORKING_SET_FACTOR * len(body))
    tables = await run_in_threadpool(decode, signal, body, encoding)
    rejected, reasons = tables.rejected, [tables.message] if tables.rejected else []
    unbound, why = stamp(tables, principal)
    rejected, reasons = rejected + unbound, [*reasons, why] if why else reasons
    chained: dict[str, list[dict[str, Any]]] = {}
    if "logs" in tables:
        tables["logs"], provenance, bad = split_provenance(tables["logs"])
        if (provenance or bad) and (principal is None or not principal.provenance):
            rejected += len(provenance) + len(bad)
            reasons.append(f"{PROVENANCE_DENIED} ({len(provenance) + len(bad)} left out)")
        else:
            chained["provenance"] = provenance
            rejected += len(bad)
            reasons.extend(bad[:3])
    await writer.submit(tables, chained)
    for name, t in tables.items():
        metrics.rows.labels(name).inc(t.num_rows)
    for name, entries in chained.items():
        metrics.rows.labels(name).inc(len(entries))
    reply = _RESPONSES[signal]()
    if rejected:
        # OTLP partial success: the rest is committed; say what was not, and why.
        setattr(reply.partial_success, _REJECTED_FIELD[signal], rejected)
        reply.partial_success.error_message = "; ".join(r for r in reasons if r)
        metrics.rejected.labels(signal).inc(rejected)
    return reply

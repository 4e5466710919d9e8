"""OTLP/HTTP receiver: ``POST /v1/traces``, ``/v1/logs``, ``/v1/metrics``.

Accepts ``application/x-protobuf`` and ``application/json``, optionally gzip-encoded. Errors
follow the OTLP/HTTP specification: a ``google.rpc.Status`` body in the request's encoding,
400 for malformed bodies, 413 for oversized ones, 415 for other content types. A 2xx means the
rows are committed in DuckDB.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CollectorRegistry, Counter, Histogram

from aiops.errors import DecodeError, PayloadTooLarge, StoreError, UnsupportedMediaType
from collectors.otlp.decode import decode
from collectors.otlp.provenance import split_provenance
from collectors.otlp.writer import BatchWriter, MemoryBudget, Overloaded

__all__ = ["ReceiverMetrics", "make_router"]

log = logging.getLogger(__name__)

_CONTENT_TYPES = {"application/x-protobuf": "protobuf", "application/json": "json"}
_RESPONSES: dict[str, type[Message]] = {
    "traces": ExportTraceServiceResponse,
    "logs": ExportLogsServiceResponse,
    "metrics": ExportMetricsServiceResponse,
}
# Peak memory of decoding a request, in multiples of its (uncompressed) body: ~10x measured
# for 20k-span requests (Python strings per cell, then Arrow buffers).
WORKING_SET_FACTOR = 12
# gRPC status codes carried in google.rpc.Status.
_INVALID_ARGUMENT, _RESOURCE_EXHAUSTED, _UNAVAILABLE = 3, 8, 14


@dataclass(frozen=True)
class ReceiverMetrics:
    requests: Counter
    rows: Counter
    seconds: Histogram
    rejected: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ReceiverMetrics:
        return cls(
            requests=Counter("aiops_otlp_requests", "OTLP export requests by signal and HTTP "
                             "status", ["signal", "code"], registry=registry),
            rows=Counter("aiops_otlp_rows", "Rows committed from OTLP", ["table"],
                         registry=registry),
            seconds=Histogram("aiops_otlp_request_seconds", "Time to decode and commit one "
                              "OTLP request", ["signal"], registry=registry),
            rejected=Counter("aiops_otlp_rejected_records", "Records left out of accepted "
                             "requests (partial success)", ["signal"], registry=registry),
        )


def _encoding(content_type: str | None) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in _CONTENT_TYPES:
        raise UnsupportedMediaType(
            f"content type {media or '(none)'!r} is not supported; "
            "use application/x-protobuf or application/json"
        )
    return _CONTENT_TYPES[media]


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise DecodeError(f"body is not valid gzip: {exc}") from exc
        if len(body) > limit or inflater.unconsumed_tail:
            raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
        if not inflater.eof:
            raise DecodeError("gzip body is truncated")
    elif coding not in ("identity", ""):
        raise UnsupportedMediaType(f"content encoding {coding!r} is not supported; use gzip")
    return body


def _status_response(code: int, grpc_code: int, message: str, encoding: str) -> Response:
    status = status_pb2.Status(code=grpc_code, message=message)
    if encoding == "protobuf":
        return Response(status.SerializeToString(), status_code=code,
                        media_type="application/x-protobuf")
    return Response(json_format.MessageToJson(status), status_code=code,
                    media_type="application/json")


def make_router(writer: BatchWriter, budget: MemoryBudget, max_body_bytes: int,
                metrics: ReceiverMetrics) -> APIRouter:
    router = APIRouter()

    async def ingest(signal: str, request: Request) -> Response:
        started = time.perf_counter()
        encoding = "json"
        held = 0
        try:
            encoding = _encoding(request.headers.get("content-type"))
            declared = request.headers.get("content-length", "")
            # Reserve before reading: the body plus its decoding working set (column lists
            # of Python objects, then Arrow), measured at about WORKING_SET_FACTOR x the body.
            want = WORKING_SET_FACTOR * min(
                int(declared) if declared.isdigit() else max_body_bytes, max_body_bytes)
            budget.acquire(want)
            held = want
            body = await _read_body(request, max_body_bytes)
            if WORKING_SET_FACTOR * len(body) > held:  # gzip expanded it
                budget.acquire(WORKING_SET_FACTOR * len(body) - held)
                held = WORKING_SET_FACTOR * len(body)
            tables = await run_in_threadpool(decode, signal, body, encoding)
            del body
            chained: dict[str, list[dict[str, Any]]] = {}
            if "logs" in tables:
                tables["logs"], chained["provenance"] = split_provenance(tables["logs"])
            written = await writer.submit(tables, chained)
        except Overloaded as exc:
            response = _status_response(503, _UNAVAILABLE, str(exc), encoding)
            response.headers["Retry-After"] = "1"
        except UnsupportedMediaType as exc:
            response = _status_response(415, _INVALID_ARGUMENT, str(exc), encoding)
        except DecodeError as exc:
            response = _status_response(400, _INVALID_ARGUMENT, str(exc), encoding)
        except PayloadTooLarge as exc:
            response = _status_response(413, _RESOURCE_EXHAUSTED, str(exc), encoding)
        except StoreError as exc:
            log.error("OTLP %s commit failed: %s", signal, exc)
            response = _status_response(503, _UNAVAILABLE, f"store unavailable: {exc}", encoding)
            response.headers["Retry-After"] = "1"
        else:
            for name, t in tables.items():
                metrics.rows.labels(name).inc(t.num_rows)
            for name, entries in chained.items():
                metrics.rows.labels(name).inc(len(entries))
            log.debug("OTLP %s: committed %d rows", signal, written)
            reply = _RESPONSES[signal]()
            if tables.rejected:
                # OTLP partial success: the rest is committed; say what was not, and why.
                field = {"traces": "rejected_spans", "logs": "rejected_log_records",
                         "metrics": "rejected_data_points"}[signal]
                setattr(reply.partial_success, field, tables.rejected)
                reply.partial_success.error_message = tables.message or ""
                metrics.rejected.labels(signal).inc(tables.rejected)
            if encoding == "protobuf":
                response = Response(reply.SerializeToString(), media_type="application/x-protobuf")
            else:
                response = Response(json_format.MessageToJson(reply),
                                    media_type="application/json")
        finally:
            if held:
                budget.release(held)
        metrics.requests.labels(signal, str(response.status_code)).inc()
        metrics.seconds.labels(signal).observe(time.perf_counter() - started)
        return response

    def endpoint_for(signal: str):  # type: ignore[no-untyped-def]
        async def endpoint(request: Request) -> Response:
            return await ingest(signal, request)

        return endpoint

    for sig in ("traces", "logs", "metrics"):
        router.add_api_route(f"/v1/{sig}", endpoint_for(sig), methods=["POST"],
                             summary=f"OTLP/HTTP {sig} export", name=f"otlp_{sig}")
    return router

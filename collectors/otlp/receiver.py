"""OTLP/HTTP receiver: ``POST /v1/traces``, ``/v1/logs``, ``/v1/metrics``.

Accepts ``application/x-protobuf`` and ``application/json``, optionally gzip-encoded. Errors
follow the OTLP/HTTP specification: a ``google.rpc.Status`` body in the request's encoding,
400 for malformed bodies, 408 for bodies not received within the read deadline, 413 for
oversized ones, 415 for other content types. A 2xx means the rows are committed in DuckDB;
records left out (invalid ones, and provenance records from a client without the serving
stack's credential) are counted in the response's ``partial_success``.

A request holds ingest memory for the bytes of its body as they arrive and for its decoding
working set once the body is complete (never for what it merely announces), and gets
``read_timeout_s`` to send its body, so slow or stalled uploads cannot starve the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib

from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.rpc import status_pb2
from starlette.requests import ClientDisconnect

from aiops.errors import AIOpsError, DecodeError, PayloadTooLarge, StoreError, UnsupportedMediaType
from collectors.otlp.export import Charge, ReceiverMetrics, export
from collectors.otlp.writer import BatchWriter, MemoryBudget, Overloaded, Unstorable

__all__ = ["BodyTimeout", "ReceiverMetrics", "make_router"]

log = logging.getLogger(__name__)

_CONTENT_TYPES = {"application/x-protobuf": "protobuf", "application/json": "json"}
# gRPC status codes carried in google.rpc.Status.
_INVALID_ARGUMENT, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNAVAILABLE = 3, 4, 8, 14


class BodyTimeout(AIOpsError):
    """A request body did not arrive within the read deadline (HTTP 408)."""


def _encoding(content_type: str | None) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in _CONTENT_TYPES:
        raise UnsupportedMediaType(
            f"content type {media or '(none)'!r} is not supported; "
            "use application/x-protobuf or application/json"
        )
    return _CONTENT_TYPES[media]


async def _receive(request: Request, limit: int, charge: Charge, timeout_s: float) -> bytes:
    """The raw body, charged to the budget chunk by chunk as it arrives, within the deadline."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if not chunk:
                    continue
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
                charge.add(len(chunk))
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s "
                          f"({size} bytes arrived)") from None
    return b"".join(chunks)


def _inflate(request: Request, body: bytes, limit: int) -> bytes:
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
                metrics: ReceiverMetrics, *, read_timeout_s: float = 10.0) -> APIRouter:
    """The OTLP/HTTP routes. ``read_timeout_s``: longest time to receive one request body."""
    router = APIRouter()

    async def ingest(signal: str, request: Request) -> Response:
        started = time.perf_counter()
        encoding = "json"
        # Set by the auth layer; only the serving stack's credential may write provenance.
        principal = getattr(request.state, "principal", None)
        # Its share of the budget is bounded per address and per named principal.
        charge = Charge(budget, getattr(principal, "name", ""),
                        request.client.host if request.client else "?")
        try:
            encoding = _encoding(request.headers.get("content-type"))
            raw = await _receive(request, max_body_bytes, charge, read_timeout_s)
            body = _inflate(request, raw, max_body_bytes)
            del raw
            reply = await export(signal, body, encoding, principal, writer, charge, metrics)
        except Overloaded as exc:
            response = _status_response(503, _UNAVAILABLE, str(exc), encoding)
            response.headers["Retry-After"] = "1"
        except UnsupportedMediaType as exc:
            response = _status_response(415, _INVALID_ARGUMENT, str(exc), encoding)
        except DecodeError as exc:
            response = _status_response(400, _INVALID_ARGUMENT, str(exc), encoding)
        except BodyTimeout as exc:
            response = _status_response(408, _DEADLINE_EXCEEDED, str(exc), encoding)
            response.headers["Connection"] = "close"  # RFC 9110: the client is too slow
        except ClientDisconnect:
            response = _status_response(400, _INVALID_ARGUMENT, "client disconnected", encoding)
        except PayloadTooLarge as exc:
            response = _status_response(413, _RESOURCE_EXHAUSTED, str(exc), encoding)
        except Unstorable as exc:  # this request's rows, not the store: do not retry them
            response = _status_response(400, _INVALID_ARGUMENT, str(exc), encoding)
        except StoreError as exc:
            log.error("OTLP %s commit failed: %s", signal, exc)
            response = _status_response(503, _UNAVAILABLE, f"store unavailable: {exc}", encoding)
            response.headers["Retry-After"] = "1"
        else:
            if encoding == "protobuf":
                response = Response(reply.SerializeToString(), media_type="application/x-protobuf")
            else:
                response = Response(json_format.MessageToJson(reply),
                                    media_type="application/json")
        finally:
            charge.release()
        metrics.requests.labels(signal, "http", str(response.status_code)).inc()
        metrics.seconds.labels(signal, "http").observe(time.perf_counter() - started)
        return response

    def endpoint_for(signal: str):  # type: ignore[no-untyped-def]
        async def endpoint(request: Request) -> Response:
            return await ingest(signal, request)

        return endpoint

    for sig in ("traces", "logs", "metrics"):
        router.add_api_route(f"/v1/{sig}", endpoint_for(sig), methods=["POST"],
                             summary=f"OTLP/HTTP {sig} export", name=f"otlp_{sig}")
    return router

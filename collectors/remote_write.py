"""Prometheus remote write receiver: ``POST /api/v1/write``, so a team's existing Prometheus
pushes into aiops with ``remote_write`` instead of aiops scraping its targets again.

Protocol: remote write **1.0** (``prometheus.WriteRequest``, snappy block-compressed protobuf,
``Content-Type: application/x-protobuf``); a 2.0 request (``proto=io.prometheus.write.v2.
Request``) gets 415 saying so, which Prometheus does not retry. Each sample becomes one
``metric_points`` row: ``__name__`` the name, ``job`` the service, ``instance`` the service
instance, the other labels its attributes; a ``..._total`` series is a cumulative monotonic sum
and every other series a gauge (1.0 carries no type per series; histogram and summary series
arrive as their ``_bucket``/``_sum``/``_count`` series and are kept so).

Answers, as Prometheus' retry rules expect: 204 stored; 400 malformed (not retried); 413 over
``max_body_bytes`` compressed or decompressed (the snappy header's length is checked before
decompressing); 503 with ``Retry-After`` when ingest buffers are full or the store is
unavailable (retried).
"""

from __future__ import annotations

import logging
from typing import Any

import cramjam
import orjson
import pyarrow as pa
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as ProtoDecodeError
from google.protobuf.message import Message

from aiops.errors import DecodeError, PayloadTooLarge, StoreError
from aiops.schema import METRIC_POINTS
from collectors.otlp.credential import stamp
from collectors.otlp.export import WORKING_SET_FACTOR, Charge, ReceiverMetrics
from collectors.otlp.writer import BatchWriter, MemoryBudget, Overloaded, Unstorable

__all__ = ["WriteRequest", "make_router", "to_table"]

log = logging.getLogger(__name__)
SCOPE = "aiops.remote_write"


def _write_request_class() -> type[Message]:
    """``prometheus.WriteRequest`` of remote write 1.0 (prometheus/prompb remote.proto and
    types.proto, the fields 1.0 defines), built with protobuf's own descriptor machinery."""
    f = descriptor_pb2.FileDescriptorProto(name="aiops/prometheus_remote_write.proto",
                                           package="prometheus", syntax="proto3")
    fd = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, str | None, bool]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            field = m.field.add(name=fname, number=number, type=ftype,
                                label=fd.LABEL_REPEATED if repeated else fd.LABEL_OPTIONAL)
            if type_name:
                field.type_name = type_name

    message("Label", ("name", 1, fd.TYPE_STRING, None, False),
            ("value", 2, fd.TYPE_STRING, None, False))
    message("Sample", ("value", 1, fd.TYPE_DOUBLE, None, False),
            ("timestamp", 2, fd.TYPE_INT64, None, False))
    message("TimeSeries", ("labels", 1, fd.TYPE_MESSAGE, ".prometheus.Label", True),
            ("samples", 2, fd.TYPE_MESSAGE, ".prometheus.Sample", True))
    message("MetricMetadata", ("type", 1, fd.TYPE_INT32, None, False),
            ("metric_family_name", 2, fd.TYPE_STRING, None, False),
            ("help", 4, fd.TYPE_STRING, None, False), ("unit", 5, fd.TYPE_STRING, None, False))
    message("WriteRequest", ("timeseries", 1, fd.TYPE_MESSAGE, ".prometheus.TimeSeries", True),
            ("metadata", 3, fd.TYPE_MESSAGE, ".prometheus.MetricMetadata", True))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    cls: type[Message] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("prometheus.WriteRequest"))
    return cls


WriteRequest = _write_request_class()


def _uncompressed_length(body: bytes) -> int:
    """The length a snappy block announces (its leading uvarint)."""
    n, shift = 0, 0
    for i, byte in enumerate(body[:5]):
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n
        shift += 7
        if i == 4:
            break
    raise DecodeError("body is not a snappy block (no length header)")


def _dumps(obj: dict[str, str]) -> str | None:
    return orjson.dumps(obj).decode() if obj else None


def to_table(request: Message) -> tuple[pa.Table, int]:
    """metric_points rows of a WriteRequest, and how many samples were left out (a series
    without ``__name__``, a timestamp outside int64 nanoseconds)."""
    wire = METRIC_POINTS.wire  # what a sender writes (the server sets ingest_credential)
    cols: dict[str, list[Any]] = {n: [] for n in wire.column_names}
    left_out = 0
    for series in request.timeseries:
        labels = {lb.name: lb.value for lb in series.labels}
        name = labels.pop("__name__", "")
        if not name:
            left_out += len(series.samples)
            continue
        job, instance = labels.pop("job", None), labels.pop("instance", None)
        resource = {k: v for k, v in (("service.name", job),
                                      ("service.instance.id", instance)) if v}
        counter = name.endswith("_total")
        attributes, resource_json = _dumps(labels), _dumps(resource)
        for sample in series.samples:
            if not -(2**63) // 1_000_000 <= sample.timestamp < 2**63 // 1_000_000:
                left_out += 1
                continue
            row = {"time": sample.timestamp * 1_000_000, "name": name, "service_name": job,
                   "resource_attributes": resource_json, "scope_name": SCOPE,
                   "type": "sum" if counter else "gauge",
                   "temporality": "cumulative" if counter else None,
                   "is_monotonic": True if counter else None,
                   "value": sample.value, "attributes": attributes}
            for n, column in cols.items():
                column.append(row.get(n))
    return pa.Table.from_pydict(cols, schema=wire.arrow_schema), left_out


def _decode(body: bytes, limit: int) -> tuple[pa.Table, int]:
    size = _uncompressed_length(body)
    if size > limit:
        raise PayloadTooLarge(f"decompressed body of {size} bytes exceeds the limit of "
                              f"{limit} bytes")
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise DecodeError(f"body is not valid snappy: {exc}") from exc
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except ProtoDecodeError as exc:
        raise DecodeError(f"body is not a remote write 1.0 WriteRequest: {exc}") from exc
    return to_table(request)


def make_router(writer: BatchWriter, budget: MemoryBudget, max_body_bytes: int,
                metrics: ReceiverMetrics) -> APIRouter:
    router = APIRouter()

    async def write(request: Request) -> Response:
        principal = getattr(request.state, "principal", None)
        charge = Charge(budget, f"{getattr(principal, 'name', '?')}@"
                                f"{request.client.host if request.client else '?'}")
        code = 204
        try:
            content_type = request.headers.get("content-type", "").lower()
            if "io.prometheus.write.v2" in content_type:
                code = 415
                return JSONResponse({"error": "remote write 2.0 is not supported; send 1.0 "
                                     "(prometheus.WriteRequest)"}, status_code=415)
            chunks, size = [], 0
            async for chunk in request.stream():  # the gate bounds its time
                size += len(chunk)
                if size > max_body_bytes:
                    raise PayloadTooLarge(f"body exceeds the limit of {max_body_bytes} bytes")
                charge.add(len(chunk))
                chunks.append(chunk)
            body = b"".join(chunks)
            charge.grow_to(WORKING_SET_FACTOR * len(body))
            table, left_out = await run_in_threadpool(_decode, body, max_body_bytes)
            tables = {"metric_points": table}
            unbound, _ = stamp(tables, principal)  # a credential bound to services, as OTLP
            left_out += unbound
            if tables["metric_points"].num_rows:
                await writer.submit(tables)
                metrics.rows.labels("metric_points").inc(tables["metric_points"].num_rows)
            if left_out:
                metrics.rejected.labels("remote_write").inc(left_out)
            return Response(status_code=204)
        except (Overloaded, StoreError) as exc:
            code = 503
            return JSONResponse({"error": str(exc)}, status_code=503,
                                headers={"Retry-After": "1"})
        except PayloadTooLarge as exc:
            code = 413
            return JSONResponse({"error": str(exc)}, status_code=413)
        except (DecodeError, Unstorable) as exc:
            code = 400
            return JSONResponse({"error": str(exc)}, status_code=400)
        finally:
            charge.release()
            metrics.requests.labels("remote_write", "http", str(code)).inc()

    router.add_api_route("/api/v1/write", write, methods=["POST"], status_code=204,
                         summary="Prometheus remote write 1.0", name="remote_write")
    return router

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
``max_body_bytes`` compressed or decompressed, over ``MAX_RATIO`` times its compressed size
(the snappy header's length is checked before decompressing), or over ``max_samples`` samples or
series (counted on the wire by the compiled decoder before the body is parsed, the count
stopping at the cap; where it was not built, counted once parsed); 503 with ``Retry-After``
when ingest buffers are full or the store is unavailable (retried).

A request is charged on what it becomes, not on its wire size: its decompressed size while it
is counted, ``PARSE_FACTOR`` times that before it is parsed, then ``ROW_BYTES`` per sample
before its rows are built (a 0.75 MiB body of empty samples is 8M rows; charged by the wire,
it would pass; counted first, it is refused after 200k steps and 15 MiB, not a 330 MB parse).
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
from collectors.otlp.export import Charge, ReceiverMetrics
from collectors.otlp.writer import BatchWriter, MemoryBudget, Overloaded, Unstorable

try:  # the compiled decoder counts a request on the wire before it is parsed (setup.py)
    from collectors.otlp import _wire  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no C compiler was available
    _wire = None

__all__ = ["MAX_RATIO", "MAX_SAMPLES", "WriteRequest", "make_router", "to_table"]

log = logging.getLogger(__name__)
SCOPE = "aiops.remote_write"
# A snappy block cannot expand past about 21x (its longest copy: 64 bytes for a 3-byte tag), so
# a header announcing more is a lie, refused before anything is decompressed.
MAX_RATIO = 32
# Samples in one request: Prometheus sends max_samples_per_send (2,000 by default) per request.
MAX_SAMPLES = 200_000
# Memory of a parsed request per decompressed byte (protobuf objects: a sample of 2 bytes on
# the wire is a message of tens of bytes: 8M empty samples, 15.3 MiB, took 330 MB to parse),
# and of one sample's row on its way to Arrow.
PARSE_FACTOR = 24
ROW_BYTES = 256


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


def _check_samples(series: int, samples: int, max_samples: int, *, early: bool = False
                   ) -> None:
    """413 past the cap; ``early``: the wire count stopped at the cap, so "or more"."""
    if max(samples, series) > max_samples:
        more = " or more" if early else ""
        raise PayloadTooLarge(f"{samples}{more} samples in {series}{more} series in one "
                              f"request; the limit is {max_samples} of either (lower "
                              f"Prometheus' queue_config.max_samples_per_send)")


def _decode(body: bytes, limit: int, charge: Charge, max_samples: int = MAX_SAMPLES
            ) -> tuple[pa.Table, int]:
    size = _uncompressed_length(body)
    if size > limit:
        raise PayloadTooLarge(f"decompressed body of {size} bytes exceeds the limit of "
                              f"{limit} bytes")
    if size > MAX_RATIO * max(len(body), 1):
        raise PayloadTooLarge(f"body decompresses {size / max(len(body), 1):.0f}x (to {size} "
                              f"bytes); the limit is {MAX_RATIO}x")
    charge.grow_to(size)
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise DecodeError(f"body is not valid snappy: {exc}") from exc
    if _wire is not None:
        try:
            series, samples = _wire.count_write_request(raw, max_samples)
        except _wire.WireError as exc:
            raise DecodeError(f"body is not a remote write 1.0 WriteRequest: {exc}") from exc
        _check_samples(series, samples, max_samples, early=True)
    charge.grow_to(PARSE_FACTOR * size)
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except ProtoDecodeError as exc:
        raise DecodeError(f"body is not a remote write 1.0 WriteRequest: {exc}") from exc
    del raw
    series = len(request.timeseries)
    samples = sum(len(s.samples) for s in request.timeseries)
    _check_samples(series, samples, max_samples)
    charge.grow_to(PARSE_FACTOR * size + ROW_BYTES * samples)
    return to_table(request)


def make_router(writer: BatchWriter, budget: MemoryBudget, max_body_bytes: int,
                metrics: ReceiverMetrics, max_samples: int = MAX_SAMPLES) -> APIRouter:
    router = APIRouter()

    async def write(request: Request) -> Response:
        principal = getattr(request.state, "principal", None)
        charge = Charge(budget, getattr(principal, "name", ""),
                        request.client.host if request.client else "?")
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
            table, left_out = await run_in_threadpool(_decode, body, max_body_bytes, charge,
                                                      max_samples)
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

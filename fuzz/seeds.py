"""A seed corpus of real exports for ``fuzz/fuzz_decode.py``: what the OpenTelemetry SDK's OTLP
exporters encode (spans with events, links, status, attributes of every type; log records with
structured bodies and trace context), a few requests each, written to ``build/fuzz/corpus``."""

from __future__ import annotations

import sys
from pathlib import Path

from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

# Instrumentations name a schema_url, on the resource and the scope (the decoder reads them).
SCHEMA = "https://opentelemetry.io/schemas/1.26.0"
RESOURCE = Resource.create({"service.name": "chat", "service.version": "v2",
                            "ray.serve.replica": "chat#abc", "host.cpus": 2}, SCHEMA)


def spans() -> list[bytes]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("aiops.serve", "1.0", SCHEMA)
    out = []
    for i in range(4):
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                          attributes={"http.response.status_code": 200 + i * 100,
                                                      "gen_ai.request.model": "smollm2",
                                                      "aiops.model.version": "v2",
                                                      "gen_ai.request.temperature": 0.7,
                                                      "tokens": [1, 2, 3], "ok": i % 2 == 0}
                                          ) as parent:
            parent.add_event("first_token", {"ttft_ms": 12.5})
            with tracer.start_as_current_span("infer", links=[Link(parent.get_span_context(),
                                                                   {"why": "retry"})]) as s:
                if i == 3:
                    s.set_status(Status(StatusCode.ERROR, "boom"))
        out.append(encode_spans(exporter.get_finished_spans()).SerializeToString())
        exporter.clear()
    return out


def logs() -> list[bytes]:
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("aiops.serve", "1.0", SCHEMA)
    tracer = TracerProvider(resource=RESOURCE).get_tracer("t")
    out = []
    for i, body in enumerate(["replica started", {"event": "oom", "sizes": [1, 2.5e-05]},
                              ["a", 1, True], 6.103515625e-05]):
        with tracer.start_as_current_span("op"):
            logger.emit(body=body, severity_number=SeverityNumber(9 + 8 * (i % 2)),
                        severity_text="INFO", attributes={"i": i, "b": b"\x00\x01"},
                        event_name="aiops.provenance" if i == 2 else None)
        out.append(encode_logs(exporter.get_finished_logs()).SerializeToString())
        exporter.clear()
    return out


def write(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    bodies = spans() + logs()
    for i, body in enumerate(bodies):
        (folder / f"seed-{i:02d}").write_bytes(body)
    return len(bodies)


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else
                Path(__file__).resolve().parents[1] / "build" / "fuzz" / "corpus"))

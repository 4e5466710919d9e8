"""``durability``: what the OTLP receiver acknowledges survives ``kill -9``; a flood past a
small ingest budget gets retryable 503s within bounded memory; slow uploads that announce big
bodies neither hold the budget nor starve valid exports, and get 408 at the read deadline.
Real ``aiops server`` subprocesses on loopback.

Span ids are ``<request number (4 bytes)><span index (4 bytes)>``, patched into one pre-encoded
template request, so every request is distinct and cheap to make, and acknowledged spans are
checked by request number: the distinct stored span ids whose first 8 hex digits are those of
an acknowledged request, counted by the server's SQL API, must equal the spans acknowledged.
"""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from aiops_harness.bench.common import running_server

__all__ = ["DurabilityResult", "OverloadResult", "SlowUploadResult", "run_durability",
           "run_overload", "run_slow_upload", "tally"]

PROTOBUF = {"content-type": "application/x-protobuf"}
_MARKER = b"\x12\x08\xa1\x0b\x5e\xd7"  # span_id's tag and length, then 4 marker bytes


def template(spans: int, attributes: bool = True) -> bytes:
    """One OTLP request of ``spans`` spans whose span ids start with the marker."""
    now = time.time_ns()
    attrs = [KeyValue(key="gen_ai.request.model",
                      value=AnyValue(string_value="smollm2-135m-instruct")),
             KeyValue(key="gen_ai.usage.output_tokens", value=AnyValue(int_value=17))]
    body: bytes = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=[KeyValue(key="service.name",
                                               value=AnyValue(string_value="bench"))]),
        scope_spans=[ScopeSpans(spans=[Span(
            trace_id=secrets.token_bytes(16), span_id=_MARKER[2:] + i.to_bytes(4, "big"),
            name="chat smollm2-135m-instruct", start_time_unix_nano=now + i,
            end_time_unix_nano=now + i + 250_000_000, attributes=attrs if attributes else [])
            for i in range(spans)])])]).SerializeToString()
    assert body.count(_MARKER) == spans
    return body


def tally(statuses: dict[int, int]) -> str:
    """``200 / 503 / other`` counts."""
    ok, refused = statuses.get(200, 0), statuses.get(503, 0)
    return f"{ok} / {refused} / {sum(statuses.values()) - ok - refused}"


def numbered(body: bytes, number: int) -> bytes:
    """The template with its span ids' first 4 bytes set to ``number``."""
    return body.replace(_MARKER, _MARKER[:2] + number.to_bytes(4, "big"))


@dataclass(frozen=True)
class DurabilityResult:
    rounds: int
    acked_spans: int
    stored_acked_spans: int
    ingest_s: float

    @property
    def lost(self) -> int:
        return self.acked_spans - self.stored_acked_spans

    @property
    def spans_per_s(self) -> float:
        return self.acked_spans / self.ingest_s


def _stored(url: str, numbers: list[int]) -> int:
    """Distinct stored span ids of the requests ``numbers``, counted in chunks."""
    total = 0
    for i in range(0, len(numbers), 5000):
        r = httpx.post(f"{url}/api/v1/sql", timeout=120, json={
            "sql": "SELECT count(DISTINCT span_id) FROM spans "
                   "WHERE substr(span_id, 1, 8) IN (SELECT unnest(?::VARCHAR[]))",
            "params": [[f"{n:08x}" for n in numbers[i:i + 5000]]]})
        r.raise_for_status()
        total += int(r.json()["rows"][0][0])
    return total


def run_durability(rounds: int = 5, seconds: float = 6.0, clients: int = 4,
                   spans_per_request: int = 2000) -> DurabilityResult:
    body = template(spans_per_request)
    counter = itertools.count(1)  # next() on it is atomic under the GIL
    acked: list[int] = []
    ingest_s = 0.0
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp:
        for _ in range(rounds):
            with running_server(Path(tmp)) as (settings, pid):
                def send(url: str = settings.server_url) -> None:
                    with httpx.Client(base_url=url, timeout=60) as c:
                        while True:
                            n = next(counter)
                            try:
                                r = c.post("/v1/traces", content=numbered(body, n),
                                           headers=PROTOBUF)
                            except httpx.HTTPError:
                                return  # killed: what was not answered is not acknowledged
                            if r.status_code == 200:
                                acked.append(n)

                threads = [threading.Thread(target=send) for _ in range(clients)]
                started = time.perf_counter()
                for t in threads:
                    t.start()
                time.sleep(seconds)
                os.kill(pid, signal.SIGKILL)  # in the middle of sustained ingest
                ingest_s += time.perf_counter() - started
                for t in threads:
                    t.join()
        with running_server(Path(tmp)) as (settings, _):
            stored = _stored(settings.server_url, sorted(acked))
    return DurabilityResult(rounds, len(acked) * spans_per_request, stored, ingest_s)


def _rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith(name + " "))


@dataclass(frozen=True)
class OverloadResult:
    request_bytes: int
    statuses: dict[int, int]
    retry_after_on_every_503: bool
    buffer_peak_bytes: float
    rss_growth_mib: float
    status_after: int


def run_overload(clients: int = 8, requests_per_client: int = 25) -> OverloadResult:
    """8 MiB ingest budget, 64 MiB DuckDB pool; ``clients`` threads post ~0.4 MiB requests
    back to back, retrying nothing."""
    body = template(5000, attributes=False)
    statuses: list[tuple[int, str | None]] = []
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp, running_server(
            Path(tmp), ingest_memory_mb=8, duckdb_memory_mb=64) as (settings, pid):
        url = settings.server_url
        baseline = _rss_mib(pid, "VmRSS")

        def flood() -> None:
            with httpx.Client(base_url=url, timeout=60) as c:
                for _ in range(requests_per_client):
                    r = c.post("/v1/traces", content=body, headers=PROTOBUF)
                    statuses.append((r.status_code, r.headers.get("retry-after")))

        threads = [threading.Thread(target=flood) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = _metric(url, "aiops_ingest_buffer_peak_bytes")
        grown = _rss_mib(pid, "VmHWM") - baseline
        after = httpx.post(f"{url}/v1/traces", content=numbered(template(10), 1),
                           headers=PROTOBUF).status_code
    codes = [s for s, _ in statuses]
    return OverloadResult(len(body), {c: codes.count(c) for c in sorted(set(codes))},
                          all(retry == "1" for s, retry in statuses if s == 503), peak, grown,
                          after)


@dataclass(frozen=True)
class SlowUploadResult:
    announced_bytes: int
    read_timeout_s: float
    statuses: dict[int, int]
    cut_off: list[tuple[str, float]]  # each slow connection: status line, seconds to it


def _slow_upload(port: int, announced: int, cut_off: list[tuple[str, float]],
                 wait_s: float) -> None:
    """Announce ``announced`` body bytes, send 10, go quiet; note the reply and when."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Content-Type: application/x-protobuf\r\nContent-Length: {announced}\r\n"
                     "\r\n".encode() + b"\x0a" * 10)
        sock.settimeout(wait_s)
        try:
            head = sock.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
        except (TimeoutError, ConnectionResetError):
            head = "(no answer)"
        cut_off.append((head or "(closed)", time.monotonic() - started))


def run_slow_upload(read_timeout_s: float = 10.0, attack_s: float = 15.0, clients: int = 4,
                    announced: int | None = None) -> SlowUploadResult:
    """Two slow uploads announcing ``announced`` bytes each (default: the largest body the
    server accepts, which two of, reserved at 12x on arrival, would take 3x the default
    256 MiB budget) while ``clients`` threads send valid 2,000-span exports for ``attack_s``."""
    body = template(2000)
    statuses: list[int] = []
    cut_off: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="aiops-bench-") as tmp, running_server(
            Path(tmp), ingest_read_timeout_s=read_timeout_s) as (settings, _):
        size = announced or settings.max_body_bytes
        slow = [threading.Thread(target=_slow_upload, args=(
            settings.server_port, size, cut_off, read_timeout_s + attack_s)) for _ in range(2)]
        for t in slow:
            t.start()
        time.sleep(0.3)  # both are in the handler, waiting for their bodies
        deadline = time.monotonic() + attack_s

        def send() -> None:
            with httpx.Client(base_url=settings.server_url, timeout=60) as c:
                while time.monotonic() < deadline:
                    statuses.append(c.post("/v1/traces", content=body,
                                           headers=PROTOBUF).status_code)

        threads = [threading.Thread(target=send) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads + slow:
            t.join()
    return SlowUploadResult(size, read_timeout_s,
                            {c: statuses.count(c) for c in sorted(set(statuses))}, cut_off)

"""The exporter a team points Ray Serve's own tracing at: each of Serve's spans leaves with the
Serve entity that made it (outside a replica: the proxy), a handle call as a client span, and a
failed replica call (an exception Serve recorded, or HTTP 5xx) with an error status, while a
request the client cancelled is no failure. Without an endpoint it exports nothing and says
so."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from aiops.attach.serve_tracing import (
    PROXY_SERVICE,
    ReleaseStamp,
    ServeSpanExporter,
    _rewrite,
    _Whoami,
    span_processors,
)
from aiops.identity import REPLICA


def _serve_spans() -> list[ReadableSpan]:
    """Spans shaped as Ray Serve 2.60 makes them (names, kinds and attributes of
    ray/serve/_private/{proxy,router,replica}.py): all SERVER, statuses unset in replicas."""
    made = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(made))
    tracer = provider.get_tracer("ray.serve._private.tracing_utils")
    with tracer.start_as_current_span("proxy_http_request", kind=SpanKind.SERVER) as s:
        s.set_attributes({"http.method": "POST", "http.status_code": "500",
                          "http.route": "/shop"})
        with tracer.start_as_current_span("route_to_replica Scorer __call__",
                                          kind=SpanKind.SERVER):
            pass
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER) as s:
        s.record_exception(RuntimeError("scorer model failed"))
    with tracer.start_as_current_span("replica_handle_request Shop __call__",
                                      kind=SpanKind.SERVER) as s:
        s.record_exception(asyncio_cancelled())
    with tracer.start_as_current_span("replica_handle_request Tokenizer __call__",
                                      kind=SpanKind.SERVER) as s:
        s.set_attributes({"http.status_code": "200"})
    provider.shutdown()
    return list(made.get_finished_spans())


def asyncio_cancelled() -> BaseException:
    import asyncio
    return asyncio.CancelledError()


def test_spans_leave_named_with_client_handle_calls_and_error_statuses() -> None:
    sent = InMemorySpanExporter()
    ServeSpanExporter(sent).export(_serve_spans())
    by_name = {s.name: s for s in sent.get_finished_spans()}
    # Outside a replica (this test process, like Serve's proxy): the proxy's service.
    assert {s.resource.attributes["service.name"] for s in by_name.values()} == {PROXY_SERVICE}
    proxy = by_name["proxy_http_request"]
    assert proxy.status.status_code is StatusCode.ERROR
    assert proxy.attributes["http.response.status_code"] == 500
    assert by_name["route_to_replica Scorer __call__"].kind is SpanKind.CLIENT
    scorer = by_name["replica_handle_request Scorer __call__"]
    assert scorer.status.status_code is StatusCode.ERROR
    assert scorer.attributes["error.type"] == "RuntimeError"
    for fine in ("replica_handle_request Shop __call__",  # cancelled by its client
                 "replica_handle_request Tokenizer __call__"):
        assert by_name[fine].status.status_code is StatusCode.UNSET, fine
    # The trace is untouched: same ids, same parent.
    assert by_name["route_to_replica Scorer __call__"].parent.span_id == proxy.context.span_id


def test_without_an_endpoint_nothing_is_exported_and_it_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with caplog.at_level(logging.WARNING):
        assert span_processors() == []
    assert "no OTEL_EXPORTER_OTLP_ENDPOINT" in caplog.text
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    (stamp, processor) = span_processors()
    assert isinstance(stamp, ReleaseStamp)
    processor.shutdown()
    # Odd settings in the team's config never fail the replica Serve is starting.
    for delay in ("0.5", "0", "-3", "soon"):
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", delay)
        (_, processor) = span_processors()
        processor.shutdown()


def test_in_a_replica_a_frameworks_own_server_span_is_a_step_not_a_second_request() -> None:
    made = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(made))
    with provider.get_tracer("ray.serve._private.tracing_utils").start_as_current_span(
            "replica_handle_request Shop __call__", kind=SpanKind.SERVER):
        pass
    with provider.get_tracer("opentelemetry.instrumentation.fastapi").start_as_current_span(
            "POST /shop/score", kind=SpanKind.SERVER):
        pass
    provider.shutdown()
    replica = {"service.name": "shop", REPLICA: "r1"}
    kinds = {s.name: _rewrite(s, replica).kind for s in made.get_finished_spans()}
    assert kinds == {"replica_handle_request Shop __call__": SpanKind.SERVER,
                     "POST /shop/score": SpanKind.INTERNAL}


class _Releases(_Whoami):
    """The exporter's identity with the controller's answer given: the release of each
    Scorer config (what the Serve controller reports for the app's deployed config)."""

    def __init__(self, releases: dict[float, str]) -> None:
        super().__init__(context=lambda: context_box[0])
        self.releases = releases
        self.reads = 0

    def _read(self, before: dict[str, Any] | None, keep_version: bool = True
              ) -> dict[str, Any]:
        self.reads += 1
        ctx = context_box[0]
        rate = ctx._deployment_config.user_config["error_rate"]
        return {"service.name": "shop.Scorer", "service.version": self.releases[rate]}


context_box: list[Any] = [None]


def _replica_context(error_rate: float) -> Any:
    """Serve's own replica context, as Serve makes a new one at start and at every
    reconfigure (ray/serve/_private/replica.py ``_set_internal_replica_context``)."""
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.config import DeploymentConfig
    from ray.serve.context import ReplicaContext

    replica = ReplicaID("r1", DeploymentID("Scorer", "shop"))
    return ReplicaContext(replica_id=replica, servable_object=None,  # type: ignore[arg-type]
                          _deployment_config=DeploymentConfig(
                              user_config={"error_rate": error_rate}),
                          rank=None, world_size=1)  # type: ignore[arg-type]


def test_an_in_place_user_config_release_names_spans_started_after_it_at_once() -> None:
    context_box[0] = _replica_context(0.0)
    whoami = _Releases({0.0: "cfg-good", 0.3: "cfg-bad"})
    sent = InMemorySpanExporter()
    provider = TracerProvider()
    exporter = ServeSpanExporter(sent, whoami)
    provider.add_span_processor(ReleaseStamp(whoami))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("ray.serve._private.tracing_utils")

    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    # One request in flight across the release: it started under the good release.
    spanning = tracer.start_span("replica_handle_request Scorer __call__", kind=SpanKind.SERVER)
    context_box[0] = _replica_context(0.3)  # `serve deploy` with a new user_config
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    spanning.end()
    # Rolled back in place: the good release again, at once.
    context_box[0] = _replica_context(0.0)
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    # Serve reconfigures for other reasons too (a rank, a scale): the same release.
    context_box[0] = _replica_context(0.0)
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    provider.shutdown()
    versions = [s.resource.attributes["service.version"] for s in sent.get_finished_spans()]
    assert versions == ["cfg-good", "cfg-bad", "cfg-good", "cfg-good", "cfg-good"]
    # The stamp never leaves the process.
    assert all("aiops.serve.release_epoch" not in (s.attributes or {})
               for s in sent.get_finished_spans())


def _stack(whoami: _Whoami) -> tuple[Any, InMemorySpanExporter, TracerProvider]:
    sent = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(ReleaseStamp(whoami))
    provider.add_span_processor(SimpleSpanProcessor(ServeSpanExporter(sent, whoami)))
    return provider.get_tracer("ray.serve._private.tracing_utils"), sent, provider


def test_a_request_that_fails_after_an_in_place_release_is_the_new_releases_failure() -> None:
    """In place, a request in flight runs the new ``user_config`` from the moment it is
    applied: if it fails, the failure is the release that raised it; if it succeeds, its
    time stays with the release it started under."""
    context_box[0] = _replica_context(0.0)
    tracer, sent, provider = _stack(_Releases({0.0: "cfg-good", 0.3: "cfg-bad"}))
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass  # traffic before the release
    failing = tracer.start_span("replica_handle_request Scorer __call__", kind=SpanKind.SERVER)
    fine = tracer.start_span("replica_handle_request Scorer __call__", kind=SpanKind.SERVER)
    context_box[0] = _replica_context(0.3)
    failing.record_exception(RuntimeError("scorer model failed"))
    failing.end()
    fine.end()
    provider.shutdown()
    got = [(s.status.status_code, s.resource.attributes["service.version"])
           for s in sent.get_finished_spans()]
    assert got == [(StatusCode.UNSET, "cfg-good"), (StatusCode.ERROR, "cfg-bad"),
                   (StatusCode.UNSET, "cfg-good")]


class _Replica:
    """What Serve's replica keeps that the context copies (ReplicaBase._deployment_config,
    ._version): Serve sets them first, calls the app's reconfigure(), then a new context."""

    def __init__(self, error_rate: float) -> None:
        from ray.serve._private.config import DeploymentConfig
        self._deployment_config = DeploymentConfig(user_config={"error_rate": error_rate})
        self._version = type("Version", (), {"code_version": "c1"})()

    def context(self) -> Any:
        from ray.serve._private.common import DeploymentID, ReplicaID
        from ray.serve.context import ReplicaContext

        def register_handle_callback(deployment_id: Any) -> None:  # Serve's closure shape
            self._registered = deployment_id

        return ReplicaContext(replica_id=ReplicaID("r1", DeploymentID("Scorer", "shop")),
                              servable_object=None,  # type: ignore[arg-type]
                              _deployment_config=self._deployment_config,
                              rank=None,  # type: ignore[arg-type]
                              world_size=1,
                              _handle_registration_callback=register_handle_callback,
                              code_version="c1")


def test_a_request_between_the_apps_reconfigure_and_the_new_context_is_the_new_release() -> None:
    from ray.serve._private.config import DeploymentConfig

    replica = _Replica(0.0)
    context_box[0] = replica.context()
    whoami = _Releases({0.0: "cfg-good", 0.3: "cfg-bad"})
    whoami._read = lambda before, keep_version=True: {  # type: ignore[method-assign]
        "service.name": "shop.Scorer",
        "service.version": whoami.releases[replica._deployment_config.user_config["error_rate"]]}
    tracer, sent, provider = _stack(whoami)
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    # `serve deploy` with a new user_config: the replica holds it and the app's reconfigure()
    # has run; Serve has not replaced the context yet.
    replica._deployment_config = DeploymentConfig(user_config={"error_rate": 0.3})
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER) as span:
        span.record_exception(RuntimeError("scorer model failed"))
    context_box[0] = replica.context()
    with tracer.start_as_current_span("replica_handle_request Scorer __call__",
                                      kind=SpanKind.SERVER):
        pass
    provider.shutdown()
    versions = [s.resource.attributes["service.version"] for s in sent.get_finished_spans()]
    assert versions == ["cfg-good", "cfg-bad", "cfg-bad"]


def test_proxy_spans_are_named_by_route_not_by_url() -> None:
    made = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(made))
    tracer = provider.get_tracer("ray.serve._private.tracing_utils")
    for path in ("/shop/score", "/shop/score?id=17", "/shop/items/4711"):
        with tracer.start_as_current_span(f"proxy_http_request Shop POST {path}",
                                          kind=SpanKind.SERVER):
            pass
    provider.shutdown()
    sent = InMemorySpanExporter()
    ServeSpanExporter(sent).export(made.get_finished_spans())
    spans = sent.get_finished_spans()
    assert {s.name for s in spans} == {"proxy_http_request Shop POST"}
    assert [s.attributes["url.path"] for s in spans] == ["/shop/score", "/shop/score?id=17",
                                                         "/shop/items/4711"]

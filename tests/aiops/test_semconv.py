"""One meaning of failed, version and model: the canary gate and the incident detector read the
same requests the same way, on aiops' own spans and on an attached app's."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from aiops import semconv
from aiops.analytics.findings import FaultClass
from aiops.analytics.traces import TraceThresholds, trace_findings
from aiops.remediation.rollout import compare
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_logs, add_points, add_spans, log

T = TraceThresholds(window_s=20, baseline_s=600)


def _span(start_ns: int, service: str, attrs: dict[str, Any], resource: dict[str, Any],
          status_code: str = "unset") -> dict[str, Any]:
    return {"trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8),
            "name": "POST /score", "kind": "server", "start_time": start_ns,
            "end_time": start_ns + 40_000_000, "duration_ns": 40_000_000,
            "status_code": status_code, "service_name": service,
            "attributes": json.dumps(attrs), "resource_attributes": json.dumps(resource)}


def _own(version: str, status: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """aiops' own serving: the model and its version as span attributes, and a 5xx reported
    only as an HTTP status (no error status), as some instrumentations do."""
    return ({"gen_ai.request.model": "chat", "aiops.model.version": version,
             "http.response.status_code": status}, {"service.version": version}, "unset")


def _attached(version: str, status: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """An attached Serve app: the release only as the resource's ``service.version``, the
    older ``http.status_code`` attribute, and the error status set on failure."""
    return ({"http.status_code": status}, {"service.version": version,
                                           "ray.serve.replica": f"r-{version}"},
            "error" if status >= 500 else "unset")


CASES = {
    "own spans, 5xx without an error status": ("chat", _own, 500),
    "attached app spans, error status": ("shop.Scorer", _attached, 503),
    "own spans, client errors (4xx)": ("chat", _own, 404),
}


def _verdicts(store: Store, service: str, shape: Any, status: int) -> tuple[bool, bool]:
    """(the gate finds the canary failing, the detector finds the canary failing)."""
    rows = []
    for i in range(40):  # stable serves well before and during; the canary fails half
        t = T0 - 200 * NS + i * 5 * NS
        rows.append(_span(t, service, *shape("v1", 200)))
    for i in range(20):
        t = T0 - 19 * NS + i * NS
        rows.append(_span(t, service, *shape("v1", 200)))
        rows.append(_span(t, service, *shape("v2", status if i % 2 else 200)))
    add_spans(store, rows)
    verdict = compare(store, service, "v1", "v2", T0 - 20 * NS, T0 + NS)
    assert verdict.ok is not None, verdict.reason  # both versions were seen by the gate
    gate_failing = verdict.ok is False and verdict.reason.startswith("errors")
    found = trace_findings(store, T0, T)
    detector_failing = any(f.fault_class == FaultClass.ERRORS and f.entity.version == "v2"
                           and f.entity.service == service for f in found)
    return gate_failing, detector_failing


@pytest.mark.parametrize("case", CASES)
def test_the_gate_and_the_detector_agree_on_the_same_requests(store: Store, case: str) -> None:
    service, shape, status = CASES[case]
    gate, detector = _verdicts(store, service, shape, status)
    assert gate == detector == (status >= 500)


def test_the_typed_columns_are_derived_once_at_ingest(store: Store) -> None:
    add_spans(store, [_span(T0, "chat", *_own("v7", 502)), _span(T0, "s", *_attached("c1", 200)),
                      _span(T0, "s", {"http.response.status_code": "oops"}, {}, "error")])
    rows = store.query(f"SELECT {semconv.MODEL}, {semconv.VERSION}, {semconv.REPLICA}, "
                       f"{semconv.HTTP_STATUS}, {semconv.FAILED} FROM spans ORDER BY service_name"
                       ).rows
    assert sorted(rows, key=str) == sorted([("chat", "v7", None, 502, True),
                                            (None, "c1", "r-c1", 200, False),
                                            (None, None, None, None, True)], key=str)


def test_python_and_sql_agree_on_failed() -> None:
    assert semconv.failed("unset", semconv.http_status({"http.status_code": "503"}))
    assert semconv.failed("error", None)
    assert not semconv.failed("unset", semconv.http_status({"http.response.status_code": 404}))
    assert not semconv.failed(None, semconv.http_status({"http.response.status_code": "x"}))


def test_the_ingest_path_derives_what_the_raw_sql_derives(store: Store) -> None:
    # The store parses each JSON map once at ingest; readers of raw rows use ``->>`` per key.
    # Both come from one definition and must agree on odd values too.
    odd: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"http.response.status_code": 503.0}, {}, "ok"),
        ({"http.response.status_code": "503", "http.status_code": 200}, {}, "unset"),
        ({"http.status_code": " 502 "}, {"service.version": 7}, "unset"),
        ({"gen_ai.request.model": "模型", "aiops.model.version": ""}, {"service.version": "r"},
         "error"),
        ({"gen_ai.request.model": {"nested": 1}}, {"ray.serve.replica": None}, "unset"),
        ({}, {}, "unset"),
    ]
    rows = [_span(T0 + i, "svc", a, r, code) for i, (a, r, code) in enumerate(odd)]
    rows.append({**_span(T0 + 99, "svc", {}, {}), "attributes": None,
                 "resource_attributes": None})
    add_spans(store, rows)
    cols = [semconv.MODEL, semconv.VERSION, semconv.REPLICA, semconv.HTTP_STATUS,
            semconv.FAILED]
    stored = store.query(f"SELECT {', '.join(cols)} FROM spans ORDER BY start_time").rows
    raw = store.query(f"SELECT {semconv.MODEL_SQL}, {semconv.VERSION_SQL}, "
                      f"{semconv.REPLICA_SQL}, {semconv.HTTP_STATUS_SQL}, {semconv.FAILED_SQL} "
                      "FROM spans ORDER BY start_time").rows
    assert stored == raw


def test_every_signal_table_carries_the_identity_columns_read_by_one_conventions_table(
        store: Store) -> None:
    """Spans, log records and metric points name model, release, replica, deployment and app
    in typed columns, derived at ingest where ``semconv.CONVENTIONS`` says; what the store
    derives equals what the raw-JSON SQL derives (archives, migrations)."""
    serve = {"service.version": "v3", "ray.serve.replica": "r1",
             "ray.serve.deployment": "Scorer", "ray.serve.app": "shop"}
    add_spans(store, [_span(T0, "shop.Scorer", {}, serve)])
    add_logs(store, [{**log(T0, "scored"), "service_name": "shop.Scorer",
                      "resource_attributes": json.dumps(serve),
                      "attributes": json.dumps({"aiops.model.version": "v4"})}])
    add_points(store, [
        # aiops' own replica: the model's series labelled by the serving code.
        {"time": T0, "name": "aiops.model.latency", "service_name": "chat",
         "attributes": {"gen_ai.request.model": "chat", "aiops.model.version": "v2",
                        "ray.serve.replica": "r7"},
         "resource_attributes": json.dumps({"service.version": "v2"})},
        # vLLM's own series, as scraped or remote written: the model in ``model_name``.
        {"time": T0 + 1, "name": "vllm:num_requests_waiting", "service_name": "vllm",
         "attributes": {"model_name": "qwen"}},
        # Ray 2.60's process series: the replica's app and deployment in ``Component`` only.
        {"time": T0 + 2, "name": "ray_component_rss_mb", "service_name": "ray",
         "attributes": {"Component": "ray::ServeReplica:shop:Scorer", "ip": "10.0.0.5"}},
        {"time": T0 + 3, "name": "ray_component_rss_mb", "service_name": "ray",
         "attributes": {"Component": "ray::IDLE"}},
    ])
    columns = ", ".join(semconv.IDENTITY)
    assert store.query(f"SELECT {columns} FROM spans").rows == [
        (None, "v3", "r1", "Scorer", "shop")]
    assert store.query(f"SELECT {columns} FROM logs").rows == [
        (None, "v4", "r1", "Scorer", "shop")]
    assert store.query(f"SELECT {columns} FROM metric_points ORDER BY time").rows == [
        ("chat", "v2", "r7", None, None), ("qwen", None, None, None, None),
        (None, None, None, "Scorer", "shop"), (None, None, None, None, None)]
    for signal in ("spans", "logs", "metric_points"):
        raw = ", ".join(semconv.RAW[signal][c] for c in semconv.IDENTITY)
        assert store.query(f"SELECT {columns} FROM {signal} ORDER BY ALL").rows == \
            store.query(f"SELECT {raw} FROM {signal} ORDER BY ALL").rows, signal

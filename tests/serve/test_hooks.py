"""Elastic-scaling hooks: warm-up before a replica takes traffic, archive after it stops.

In process against a real aiops server (echo and the three real backends the tests use), then
on the real stack: warm-up spans precede every replica's first request, a failing warm-up
fails the deploy with its reason, and scaling a version 2 -> 1 leaves the retired replicas'
archive records in the store, their provenance digests matching the provenance table."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from pydantic import ValidationError

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.lifecycle import LifecycleClient, LifecycleError
from serve.hooks import RETIRED_EVENT, WarmupFailed, provenance_digest
from serve.replica import ModelReplica, input_digest
from serve.specs import Hooks, ModelSpec, Warmup, load_specs
from serve.telemetry import TelemetryConfig
from tests.conftest import TEST_MODELS, RunningServer, running_stack

T = TypeVar("T")

ECHO: dict[str, Any] = {"name": "echo", "version": "v1", "backend": "echo", "model_type": "llm"}
PAYLOAD = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8,
           "temperature": 0.0}


def echo(**over: Any) -> ModelSpec:
    return ModelSpec.model_validate({**ECHO, **over})


def poll(probe: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout_s:.0f} s")
        time.sleep(0.5)


# -- the spec ------------------------------------------------------------------------------


def test_hooks_default_to_no_warmup_and_an_archive_on_stop() -> None:
    spec = echo()
    assert spec.hooks.warmup is None
    assert spec.hooks.post_scale_in.archive and spec.hooks.post_scale_in.flush
    warmed = echo(hooks={"warmup": {}})
    assert warmed.hooks.warmup is not None and warmed.hooks.warmup.count == 1


@pytest.mark.parametrize(("over", "message"), [
    ({"hooks": {"warmup": {"requests": [{"text": "x", "tokens": 1}]}}}, "Extra inputs"),
    ({"hooks": {"warmup": {"requests": [{}]}}}, "llm models need 'text'"),
    ({"hooks": {"warmup": {"requests": [{"image": "aGVsbG8="}]}}}, "llm models take none"),
    ({"hooks": {"warmup": {"requests": [{"text": "x", "max_tokens": 0}]}}}, "greater than"),
    ({"hooks": {"warmup": {"count": 0}}}, "greater than or equal to 1"),
    ({"hooks": {"warmup": {"timeout_s": 0}}}, "greater than 0"),
    ({"hooks": {"post_scale_in": {"timeout_s": 30}}}, "less than or equal to 8"),
    ({"hooks": {"post_scale_in": {"flush": "sometimes"}}}, "valid boolean"),
])
def test_hooks_are_validated_strictly(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        echo(**over)


def test_a_vision_warmup_image_must_be_base64() -> None:
    with pytest.raises(ValidationError, match="image is not base64"):
        ModelSpec.model_validate({
            "name": "ocr", "version": "v1", "backend": "onnx_ocr", "model_type": "vision",
            "hooks": {"warmup": {"requests": [{"image": "not base64!"}]}}})


def test_a_spec_file_names_the_model_and_the_hook_field(tmp_path: Path) -> None:
    from serve.specs import SpecError

    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {**ECHO, "hooks": {"warmup": {"requests": [{"text": "x"}], "count": 500}}}]}))
    with pytest.raises(SpecError, match=r"model 'echo': hooks.warmup.count: Input should be "
                                        r"less than or equal to 100"):
        load_specs(path)


# -- in process, real OTLP export ----------------------------------------------------------


def test_the_warmup_runs_in_the_constructor_and_stays_out_of_request_telemetry(
    server: RunningServer,
) -> None:
    spec = echo(version="w1", hooks={"warmup": {"requests": [{"text": "one two"}],
                                                "count": 3}})
    replica = ModelReplica(spec, TelemetryConfig(server.url, 60.0, provenance=False),
                           {"service.instance.id": "r-warm"})
    try:
        # Warmed before anyone could call it.
        assert replica.ledger.warmup is not None and replica.ledger.warmup.requests == 3
        assert replica.ledger.served == 0
        replica.telemetry.flush()
        rows = server.store.query(
            "SELECT name, parent_span_id, status_code, (attributes->>'aiops.warmup'), "
            "json_array_length(events), (attributes->>'aiops.warmup.requests') FROM spans "
            "WHERE (resource_attributes->>'service.instance.id') = 'r-warm'").rows
        assert rows == [("warmup echo", None, "unset", "true", 3, "3")]
        # No request metrics and no request span come from a warm-up.
        assert server.store.query(
            "SELECT count(*) FROM metric_points WHERE name IN ('aiops.model.requests', "
            "'gen_ai.server.request.duration') AND (attributes->>'aiops.model.version') = 'w1'"
        ).rows == [(0,)]
        out = asyncio.run(replica.generate(PAYLOAD, {}, "inf-after-warmup"))
        assert out["text"] == "one two three" and replica.ledger.served == 1
    finally:
        replica.close()


REAL_MODELS = {s.backend: s for s in load_specs(TEST_MODELS)}


@pytest.mark.parametrize("backend", ["llama_cpp", "onnx_embedding", "onnx_ocr"])
def test_each_real_backend_has_a_default_warmup(server: RunningServer, backend: str) -> None:
    spec = REAL_MODELS[backend].model_copy(update={"hooks": Hooks(warmup=Warmup())})
    replica = ModelReplica(spec, TelemetryConfig(server.url, 60.0, provenance=False),
                           {"service.instance.id": f"r-{backend}"})
    try:
        report = replica.ledger.warmup
        assert report is not None and report.requests == 1 and report.seconds > 0
    finally:
        replica.close()
    assert server.store.query(
        "SELECT count(*) FROM spans WHERE (attributes->>'aiops.warmup') = 'true' AND "
        "(resource_attributes->>'service.instance.id') = ?", [f"r-{backend}"]).rows == [(1,)]


def test_a_failing_warmup_refuses_the_replica_and_says_why(server: RunningServer) -> None:
    spec = echo(version="w2", output_schema={"properties": {"text": {"maxLength": 3}}},
                hooks={"warmup": {"requests": [{"text": "far too long", "max_tokens": 8}]}})
    with pytest.raises(WarmupFailed, match=r"echo:w2: warm-up request 1 of 1 failed: output "
                                           r"violates the model's output_schema"):
        ModelReplica(spec, TelemetryConfig(server.url, 60.0, provenance=False),
                     {"service.instance.id": "r-bad"})
    # Its telemetry was flushed on the way out: the reason is in the store.
    rows = server.store.query(
        "SELECT status_code, status_message FROM spans WHERE "
        "(resource_attributes->>'service.instance.id') = 'r-bad'").rows
    assert len(rows) == 1 and rows[0][0] == "error" and "output_schema" in rows[0][1]


def test_a_warmup_over_its_bound_refuses_the_replica(server: RunningServer) -> None:
    spec = echo(version="w3", options={"delay_s": 2.0},
                hooks={"warmup": {"requests": [{"text": "slow"}], "timeout_s": 0.2}})
    started = time.monotonic()
    with pytest.raises(WarmupFailed, match=r"did not finish within 0.2 s \(0 of 1 requests"):
        ModelReplica(spec, TelemetryConfig(server.url, 60.0, provenance=False))
    assert time.monotonic() - started < 1.5


def test_closing_emits_the_archive_record_and_flushes(server: RunningServer) -> None:
    spec = echo(version="w4", resources={"num_cpus": 0.5, "memory_mb": 64})
    # Provenance on: its entries are refused by this credential-less server, but the replica
    # emitted them, so the archive seals them.
    replica = ModelReplica(spec, TelemetryConfig(server.url, 60.0),
                           {"service.instance.id": "r-arch"})
    ids = [f"inf-{i}" for i in range(3)]
    for i in ids:
        asyncio.run(replica.generate(PAYLOAD, {}, i))
    replica.close()
    replica.close()  # once only
    rows = server.store.query(
        "SELECT body, severity_text, attributes FROM logs WHERE event_name = ?",
        [RETIRED_EVENT]).rows
    assert len(rows) == 1
    body, severity, attributes = rows[0]
    record = json.loads(attributes)
    assert severity == "INFO" and body.startswith("replica r-arch of echo@w4 retired after")
    assert record["replica"] == "r-arch" and record["model"] == "echo"
    assert record["version"] == "w4" and record["artifact_digest"] == "none"
    assert record["requests_served"] == 3 and record["requests_failed"] == 0
    assert record["provenance_entries"] == 3
    assert record["provenance_digest"] == provenance_digest(
        [(i, input_digest(PAYLOAD)) for i in ids])
    assert record["released.num_cpus"] == 0.5 and record["released.memory_mb"] == 64
    assert record["released.rss_mb"] > 10 and record["released.peak_rss_mb"] >= \
        record["released.rss_mb"]
    assert record["uptime_s"] > 0 and len(record["hardware"]) > 10
    # The final metric export happened too: the three requests are counted.
    assert server.store.query(
        "SELECT max(value) FROM metric_points WHERE name = 'aiops.model.requests' AND "
        "(attributes->>'aiops.model.version') = 'w4'").rows == [(3.0,)]


def test_no_archive_when_the_spec_says_so(server: RunningServer) -> None:
    spec = echo(version="w5", hooks={"post_scale_in": {"archive": False}})
    ModelReplica(spec, TelemetryConfig(server.url, 60.0, provenance=False)).close()
    assert server.store.query("SELECT count(*) FROM logs WHERE event_name = ?",
                              [RETIRED_EVENT]).rows == [(0,)]


# -- the real stack ------------------------------------------------------------------------

STACK_ECHO = {**ECHO, "max_ongoing_requests": 8, "resources": {"num_cpus": 0.1},
              "qos": {"max_queue": 64},
              "autoscaling": {"min_replicas": 2, "max_replicas": 2},
              "hooks": {"warmup": {"requests": [{"text": "warm up please"}], "count": 2}}}


@pytest.fixture(scope="module")
def hooks_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("hooks")
    models = tmp / "models.yaml"
    models.write_text(yaml.safe_dump({"models": [STACK_ECHO]}))
    with running_stack(tmp / "stack", models, ebpf="off") as s:
        yield s


def _ask(settings: Settings, n: int) -> list[str]:
    """n chat requests; their trace ids."""
    traces = []
    with httpx.Client(base_url=settings.serve_url, timeout=30) as c:
        for _ in range(n):
            r = c.post("/v1/chat/completions", json={
                "model": "echo", "messages": [{"role": "user", "content": "ping"}]})
            assert r.status_code == 200, r.text
            traces.append(r.headers["traceparent"].split("-")[1])
    return traces


_REPLICA = "(resource_attributes->>'service.instance.id')"


def _marks(values: list[Any]) -> str:
    return ", ".join("?" * len(values))


@pytest.mark.stack
def test_on_the_stack_every_replica_warms_up_before_its_first_request(
    hooks_stack: Settings,
) -> None:
    traces = _ask(hooks_stack, 20)
    with ServerClient.of(hooks_stack) as db:
        poll(lambda: db.rows("SELECT count(*) AS n FROM spans WHERE service_name = 'echo' "
                             "AND name = 'chat echo'")[0]["n"] >= 20, "the model spans")
        served = db.rows(f"SELECT {_REPLICA} AS replica, min(start_time) AS first FROM spans "
                         "WHERE service_name = 'echo' AND name = 'chat echo' GROUP BY ALL")
        warmups = {r["replica"]: r for r in db.rows(
            f"SELECT {_REPLICA} AS replica, max(end_time) AS done, count(*) AS n, "
            "any_value(trace_id) AS trace FROM spans WHERE service_name = 'echo' "
            "AND (attributes->>'aiops.warmup') = 'true' GROUP BY ALL")}
        for row in served:
            warm = warmups[row["replica"]]
            assert warm["n"] == 1 and warm["done"] < row["first"], (row, warm)
        # A warm-up is a trace of its own, with no ingress span: the SLIs never see it.
        for warm in warmups.values():
            names = {r["service_name"] for r in db.rows(
                "SELECT service_name FROM spans WHERE trace_id = ?", [warm["trace"]])}
            assert names == {"echo"}
        # Every request's ingress span arrives (the ingress replica exports on its own
        # schedule, so wait for it rather than read it once the model's spans are in).
        def ingress() -> int:
            return int(db.rows("SELECT count(*) AS n FROM spans WHERE service_name = 'ingress' "
                               f"AND kind = 'server' AND trace_id IN ({_marks(traces)})",
                               traces)[0]["n"])

        poll(lambda: ingress() >= 20, "the 20 requests' ingress spans")
        assert ingress() == 20


@pytest.mark.stack
def test_on_the_stack_a_failing_warmup_fails_the_deploy_with_its_reason(
    hooks_stack: Settings,
) -> None:
    bad = {**STACK_ECHO, "version": "v2", "traffic": 0,
           "autoscaling": {"min_replicas": 1, "max_replicas": 1},
           "output_schema": {"properties": {"text": {"maxLength": 3}}},
           "hooks": {"warmup": {"requests": [{"text": "far too long", "max_tokens": 8}]}}}
    good = {**STACK_ECHO, "traffic": 100}
    with LifecycleClient.from_settings(hooks_stack) as control:
        before = control.status().models["echo"]
        with pytest.raises(LifecycleError, match=r"409.*echo-v2.*warm-up request 1 of 1 failed"):
            control.apply([good, bad])
        assert control.status().models["echo"] == before
        control.apply([STACK_ECHO])  # Serve drops the failed version's application
    assert _ask(hooks_stack, 3)
    # Each refused start flushed its telemetry: the reason is in the store.
    with ServerClient.of(hooks_stack) as db:
        refused = db.rows("SELECT status_message FROM spans WHERE service_name = 'echo' AND "
                          "(attributes->>'aiops.model.version') = 'v2' AND status_code = 'error' "
                          "AND (attributes->>'aiops.warmup') = 'true'")
    assert refused and all(r["status_message"] == "echo:v2: warm-up request 1 of 1 failed: "
                           "output violates the model's output_schema: 'far too long' is too "
                           "long" for r in refused), refused


@pytest.mark.stack
def test_scaling_in_2_to_1_archives_the_retired_replicas(hooks_stack: Settings) -> None:
    _ask(hooks_stack, 10)
    with ServerClient.of(hooks_stack) as db, LifecycleClient.from_settings(hooks_stack) as c:
        time.sleep(2)  # the last spans are exported
        before = {r["replica"] for r in db.rows(
            f"SELECT DISTINCT {_REPLICA} AS replica FROM spans WHERE service_name = 'echo'")}
        assert len(before) >= 2
        c.scale("echo", "v1", 1, 1)

        def retired() -> list[dict[str, Any]]:
            rows = db.rows("SELECT attributes FROM logs WHERE event_name = ?", [RETIRED_EVENT])
            records = [json.loads(r["attributes"]) for r in rows]
            return [r for r in records if r["replica"] in before]

        records = poll(retired, "the retired replicas' archive records")
        for record in records:
            assert (record["model"], record["version"]) == ("echo", "v1")
            assert record["released.num_cpus"] == 0.1 and record["released.rss_mb"] > 10
            assert record["warmup_requests"] == 2 and record["uptime_s"] > 0
            spans = db.rows(
                f"SELECT (attributes->>'inference_id') AS id FROM spans WHERE {_REPLICA} = ? "
                "AND name = 'chat echo'", [record["replica"]])
            assert record["requests_served"] == len(spans)
            # The archive seals exactly the entries the provenance chain holds for it.
            ids = [s["id"] for s in spans]
            entries = db.rows("SELECT inference_id, input_hash FROM provenance WHERE "
                              f"inference_id IN ({_marks(ids)})", ids) if ids else []
            assert record["provenance_entries"] == len(entries)
            assert record["provenance_digest"] == provenance_digest(
                [(e["inference_id"], e["input_hash"]) for e in entries])
        bounds = c.status().models["echo"].versions[0].autoscaling
        assert bounds is not None and bounds.wire() == {"min_replicas": 1, "max_replicas": 1}

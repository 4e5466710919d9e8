"""Model lifecycle on the real stack: canary split, hot reload under traffic, stickiness,
faults, and the token on the control plane."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.lifecycle import LifecycleClient, LifecycleError
from serve.specs import load_specs
from tests.conftest import running_stack

pytestmark = pytest.mark.stack

MODELS = Path(__file__).resolve().parents[1] / "models-lifecycle.yaml"
EMBED = "minilm-l6-v2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with running_stack(tmp_path_factory.mktemp("lifecycle"), MODELS) as s:
        yield s


@pytest.fixture(scope="module")
def control(stack: Settings) -> Iterator[LifecycleClient]:
    with LifecycleClient.from_settings(stack) as c:
        yield c


def echo_specs(tmp: Path, weights: dict[str, int]) -> list[dict[str, Any]]:
    """The lifecycle file plus echo versions with the given weights, as the CLI sends it."""
    doc = yaml.safe_load(MODELS.read_text())
    base = doc["models"][0]
    doc["models"] = [{**base, "version": v, "traffic": w} for v, w in weights.items()] + \
        doc["models"][1:]
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(doc))
    return [s.model_dump(mode="json") for s in load_specs(path)]


def ask(client: httpx.Client, session: str | None = None) -> tuple[int, str | None]:
    headers = {"x-aiops-session": session} if session else {}
    r = client.post("/v1/chat/completions", headers=headers, json={
        "model": "echo", "messages": [{"role": "user", "content": "ping"}]})
    return r.status_code, r.headers.get("x-aiops-model-version")


def test_a_5_percent_canary_gets_5_percent_of_2000_requests(
    stack: Settings, control: LifecycleClient, tmp_path: Path,
) -> None:
    control.apply(echo_specs(tmp_path, {"v1": 100, "v2": 0}))
    control.canary("echo", "v2", 5)
    # The split is what is measured, not how soon the ingress replicas take the new table (an
    # in-place reconfigure: a CI run counted 66 of 2,000 when its first requests beat it).
    with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
        assert any(ask(c)[1] == "v2" for _ in range(1000)), "the canary never took traffic"
    time.sleep(1.0)

    def batch(n: int) -> list[tuple[int, str | None]]:
        with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
            return [ask(c) for _ in range(n)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = [r for part in pool.map(batch, [250] * 8) for r in part]
    assert Counter(s for s, _ in results) == {200: 2000}
    share = Counter(v for _, v in results)["v2"] / 2000
    assert 0.035 <= share <= 0.065, share


def test_a_sticky_session_keeps_its_version(stack: Settings, control: LifecycleClient) -> None:
    control.set_traffic("echo", {"v1": 50, "v2": 50})
    with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
        for session in ("alice", "bob", "carol", "dave"):
            versions = {ask(c, session)[1] for _ in range(10)}
            assert len(versions) == 1, (session, versions)


def test_hot_reload_under_traffic_fails_no_request_and_disturbs_no_other_model(
    stack: Settings, control: LifecycleClient, tmp_path: Path,
) -> None:
    stop = threading.Event()
    seen: list[tuple[int, str | None]] = []

    def traffic() -> None:
        with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
            while not stop.is_set():
                seen.append(ask(c))
                c.post("/v1/embeddings", json={"model": EMBED, "input": "still here"})

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        out = control.apply(echo_specs(tmp_path, {"v1": 50, "v2": 50, "v3": 0}))
        assert out["added"] == ["echo:v3"]
        control.promote("echo", "v3")
        time.sleep(1)
        cut = len(seen)
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert seen and all(status == 200 for status, _ in seen), Counter(seen)
    assert {v for _, v in seen[cut:]} == {"v3"}
    # The embedding model kept its one replica throughout.
    with ServerClient(stack.server_url) as db:
        time.sleep(1.5)
        replicas = db.rows("SELECT DISTINCT (resource_attributes->>'service.instance.id') AS r "
                           "FROM spans WHERE service_name = ?", [EMBED])
    assert len(replicas) == 1


def test_faults_show_only_as_their_effects(
    stack: Settings, control: LifecycleClient,
) -> None:
    control.set_faults("echo", "v3", {"latency_ms": 300, "error_rate": 1.0})
    with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
        started = time.perf_counter()
        status, version = ask(c)
        elapsed = time.perf_counter() - started
    assert status == 500 and version == "v3" and elapsed >= 0.3
    control.set_faults("echo", "v3", {})
    with httpx.Client(base_url=stack.serve_url, timeout=30) as c:
        assert ask(c)[0] == 200
    with ServerClient(stack.server_url) as db:
        time.sleep(1.5)
        leaks = db.rows(
            "SELECT count(*) AS n FROM (SELECT attributes::VARCHAR || coalesce(body, '') AS t "
            "FROM logs UNION ALL SELECT attributes::VARCHAR || name FROM spans UNION ALL "
            "SELECT attributes::VARCHAR || name FROM metric_points) WHERE t ILIKE '%fault%'")
    assert leaks[0]["n"] == 0


def test_the_control_plane_wants_its_token(stack: Settings) -> None:
    with LifecycleClient(f"http://127.0.0.1:{stack.control_port}", "wrong") as bad, \
            pytest.raises(LifecycleError, match="401"):
        bad.status()


def test_a_version_whose_outputs_drift_from_its_package_reference_never_serves(
    stack: Settings, control: LifecycleClient, tmp_path: Path,
) -> None:
    from serve.backends.base import get_backend
    from serve.gates import default_reference_inputs, reference_outputs
    from serve.packages import generate_keys, pack

    spec = next(s for s in load_specs(MODELS) if s.name == EMBED)
    backend: Any = get_backend(spec.backend)(spec)
    backend.start()
    inputs = default_reference_inputs("embedding")
    outputs = reference_outputs(backend, "embedding", inputs)
    drifted = [[x + 1e-3 for x in v] for v in outputs]
    private, _ = generate_keys(tmp_path / "keys")
    bundle = pack(spec.artifact_path(), tmp_path / "pkg", name=EMBED, version="v2",
                  backend=spec.backend, private_key=private,
                  reference={"kind": "embedding", "inputs": inputs, "outputs": drifted})
    before = control.status().models[EMBED]
    specs = [s.model_dump(mode="json") for s in load_specs(MODELS)]
    emb = next(s for s in specs if s["name"] == EMBED)
    specs = [s for s in specs if s["name"] != EMBED] + [
        {**emb, "traffic": 100},
        {**emb, "version": "v2", "traffic": 0, "artifact": {"bundle": str(bundle)}}]
    with pytest.raises(LifecycleError, match=r"422.*v2 failed its validation gate: numeric "
                                             r"check failed: input 0: L2 distance"):
        control.apply(specs)
    assert control.status().models[EMBED] == before

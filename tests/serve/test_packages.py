"""Signed packages: a flipped byte, a wrong signer, an edited manifest or a stray file are
refused, saying which; a version whose outputs drift from its reference fails its gate."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from serve.backends.base import get_backend
from serve.control import GateRefused, ServeControl
from serve.gates import Trust, default_reference_inputs, reference_outputs
from serve.packages import PackageError, generate_keys, load_public_keys, pack, verify_package
from serve.replica import ModelReplica
from serve.specs import ModelSpec, load_specs
from serve.telemetry import TelemetryConfig
from tests.conftest import RunningServer


@pytest.fixture(scope="module")
def embedding_spec() -> ModelSpec:
    return next(s for s in load_specs() if s.backend == "onnx_embedding")


@pytest.fixture(scope="module")
def reference(embedding_spec: ModelSpec) -> dict[str, Any]:
    backend: Any = get_backend("onnx_embedding")(embedding_spec)
    backend.start()
    inputs = default_reference_inputs("embedding")
    outputs = reference_outputs(backend, "embedding", inputs)
    return {"kind": "embedding", "inputs": inputs, "outputs": outputs, "tolerance": 1e-4}


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keys(tmp_path / "keys")


@pytest.fixture
def package(tmp_path: Path, keys: tuple[Path, Path], embedding_spec: ModelSpec,
            reference: dict[str, Any]) -> Path:
    return pack(embedding_spec.artifact_path(), tmp_path / "pkg", name="minilm", version="v2",
                backend="onnx_embedding", private_key=keys[0], reference=reference)


def test_a_fresh_package_verifies(package: Path, keys: tuple[Path, Path]) -> None:
    v = verify_package(package, load_public_keys([keys[1]]))
    assert v.manifest["name"] == "minilm" and v.artifact.name == "model.onnx"
    assert v.digest.startswith("sha256:") and v.reference() is not None


def test_one_flipped_byte_is_refused(package: Path, keys: tuple[Path, Path]) -> None:
    model = package / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"model\.onnx does not match its sha256"):
        verify_package(package, load_public_keys([keys[1]]))


def test_a_signature_from_another_key_is_refused(package: Path, tmp_path: Path) -> None:
    _, stranger = generate_keys(tmp_path / "other")
    with pytest.raises(PackageError, match="does not match the manifest under any trusted key"):
        verify_package(package, load_public_keys([stranger]))


def test_an_edited_manifest_is_refused(package: Path, keys: tuple[Path, Path]) -> None:
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["version"] = "v9"
    (package / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    with pytest.raises(PackageError, match="signature does not match"):
        verify_package(package, load_public_keys([keys[1]]))


def test_unsigned_and_padded_packages_are_refused(package: Path,
                                                  keys: tuple[Path, Path]) -> None:
    (package / "extra.bin").write_bytes(b"smuggled")
    with pytest.raises(PackageError, match="not in the manifest"):
        verify_package(package, load_public_keys([keys[1]]))
    (package / "manifest.sig").unlink()
    with pytest.raises(PackageError, match="unsigned"):
        verify_package(package, load_public_keys([keys[1]]))


def bundle_spec(package: Path) -> ModelSpec:
    return ModelSpec.model_validate({"name": "minilm", "version": "v2",
                                     "backend": "onnx_embedding", "model_type": "embedding",
                                     "artifact": {"bundle": str(package)}})


def test_outputs_that_drift_from_the_reference_fail_the_gate(
    tmp_path: Path, keys: tuple[Path, Path], embedding_spec: ModelSpec,
    reference: dict[str, Any], server: RunningServer,
) -> None:
    drifted = {**reference, "outputs": [[x + 1e-3 for x in v] for v in reference["outputs"]]}
    bad = pack(embedding_spec.artifact_path(), tmp_path / "bad", name="minilm", version="v2",
               backend="onnx_embedding", private_key=keys[0], reference=drifted)
    replica = ModelReplica(bundle_spec(bad),
                                TelemetryConfig(server.url, 60.0),
                                trust=Trust(True, (keys[1],)))
    try:
        report = asyncio.run(replica.self_test())
    finally:
        replica.close()
    assert not report["ok"]
    assert "numeric check failed: input 0: L2 distance" in report["reason"]


def test_a_faithful_package_passes_the_gate(package: Path, keys: tuple[Path, Path],
                                            server: RunningServer) -> None:
    replica = ModelReplica(bundle_spec(package), TelemetryConfig(server.url, 60.0),
                           trust=Trust(True, (keys[1],)))
    try:
        report = asyncio.run(replica.self_test())
    finally:
        replica.close()
    assert report["ok"] and report["reference"] == 2


def test_strict_mode_refuses_unsigned_or_tampered_versions_before_deploying(
    package: Path, keys: tuple[Path, Path], embedding_spec: ModelSpec, tmp_path: Path,
) -> None:
    deployed: list[dict[str, Any]] = []
    strict = Trust(True, (keys[1],))
    control = ServeControl([bundle_spec(package)], TelemetryConfig("http://x"), {},
                           deployed.append, trust=strict, cluster_cpus=2)
    control.deploy()
    n = len(deployed)
    with pytest.raises(GateRefused, match="strict mode serves only signed packages"):
        control.apply([bundle_spec(package).model_copy(update={"traffic": 100}),
                       embedding_spec.model_copy(update={"name": "other"})])
    tampered = shutil.copytree(package, tmp_path / "tampered")
    with open(tampered / "model.onnx", "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(GateRefused, match="package refused"):
        control.apply([bundle_spec(tampered)])
    assert len(deployed) == n  # nothing was deployed

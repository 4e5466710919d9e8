"""``aiops keygen``, ``aiops model-key``, ``aiops pack`` and ``aiops verify``: signed (and
optionally encrypted) model packages (``serve.packages``, ``serve.keys``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aiops.cli_common import console, fail
from aiops.errors import AIOpsError

__all__ = ["register"]


def keygen(
    directory: Annotated[Path, typer.Argument(help="Where to write NAME.key and NAME.pub.")],
    name: Annotated[str, typer.Option(help="File name stem.")] = "aiops",
) -> None:
    """Create an Ed25519 key pair for signing model packages."""
    from serve.packages import generate_keys

    try:
        private, public = generate_keys(directory, name)
    except (AIOpsError, FileExistsError) as exc:
        raise fail(AIOpsError(str(exc))) from exc
    console.print(f"private key: {private} (keep it secret)\npublic key:  {public}")


def model_key(
    path: Annotated[Path, typer.Argument(help="Key file to create (0600, never overwritten).")],
) -> None:
    """Create a random AES-256 key file for `aiops pack --encrypt`; replicas read it from
    AIOPS_MODEL_KEY_FILE."""
    from serve.keys import fingerprint, generate_model_key, parse_key

    try:
        generate_model_key(path)
    except OSError as exc:
        raise fail(AIOpsError(f"cannot create {path}: {exc.strerror or exc}")) from exc
    key = parse_key(path.read_bytes(), str(path))
    console.print(f"model key: {path} (keep it secret), fingerprint {fingerprint(key)}")


def _encryption_key(key_file: Path | None, key_id: str) -> Any:
    from serve.keys import HOW_TO_CONFIGURE, FileKeyProvider, key_provider_from_env
    from serve.packages import ModelKey

    provider = FileKeyProvider(key_file) if key_file is not None else key_provider_from_env()
    if provider is None:
        raise AIOpsError(f"--encrypt needs a key: give --key-file, or {HOW_TO_CONFIGURE}")
    return ModelKey(key_id, provider.key_for(key_id))


def pack_cmd(
    spec_file: Annotated[Path, typer.Option("--spec", help="Model spec file.")],
    model: Annotated[str, typer.Option(help="Model name in the spec file.")],
    key: Annotated[Path, typer.Option(help="Ed25519 private key (PEM) that signs.")],
    out: Annotated[Path, typer.Option(help="Package directory to create.")],
    version: Annotated[str | None, typer.Option(help="Version (default: the only one).")] = None,
    reference: Annotated[bool, typer.Option(help="Record reference outputs.")] = True,
    encrypt: Annotated[bool, typer.Option(
        help="Encrypt the artifact at rest (AES-256-GCM).")] = False,
    key_file: Annotated[Path | None, typer.Option(
        help="AES-256 key file for --encrypt (default: $AIOPS_MODEL_KEY_FILE, "
        "$AIOPS_MODEL_KEY or $AIOPS_MODEL_KEY_PROVIDER).")] = None,
    key_id: Annotated[str, typer.Option(
        help="Key id the manifest records (what a KMS provider is asked for).")] = "default",
) -> None:
    """Build a signed package: the model's artifact (encrypted with --encrypt), a manifest of
    sha256 digests, reference outputs computed by running the model here, and an Ed25519
    signature."""
    from serve.backends.base import get_backend
    from serve.gates import default_reference_inputs, reference_kind, reference_outputs
    from serve.packages import pack
    from serve.specs import load_specs

    try:
        specs = [s for s in load_specs(spec_file) if s.name == model
                 and (version is None or s.version == version)]
        if len(specs) != 1:
            raise AIOpsError(f"{spec_file} has {len(specs)} matching versions of {model!r}; "
                             "name one with --version")
        spec = specs[0]
        if spec.artifact is not None and spec.artifact.bundle is not None:
            raise AIOpsError(f"{model}: pack from the model's own artifact, not a package")
        sealing = _encryption_key(key_file, key_id) if encrypt else None
        ref: dict[str, Any] | None = None
        n_ref = 0
        if reference:
            kind = reference_kind(spec)
            inputs = default_reference_inputs(kind)
            backend: Any = get_backend(spec.backend)(spec)
            backend.start()
            try:
                outputs = reference_outputs(backend, kind, inputs, 16)
            finally:
                backend.shutdown()
            ref = {"kind": kind, "inputs": inputs, "outputs": outputs, "tolerance": 1e-4,
                   "max_tokens": 16}
            n_ref = len(inputs)
        path = pack(spec.artifact_path(), out, name=spec.name, version=spec.version,
                    backend=spec.backend, private_key=key, reference=ref, encrypt=sealing)
    except AIOpsError as exc:
        raise fail(exc) from exc
    console.print(f"packed {spec.name}:{spec.version} into {path}"
                  + (f" with {n_ref} reference output(s)" if n_ref else "")
                  + (f", encrypted with key {key_id!r}" if sealing is not None else ""))


def verify_cmd(
    package: Annotated[Path, typer.Argument(help="Package directory.")],
    key: Annotated[list[Path], typer.Option(help="Trusted public key(s) (PEM).")],
    decrypt: Annotated[bool, typer.Option(
        help="Also decrypt every chunk of an encrypted package (in memory, nothing kept) "
        "with the configured key: $AIOPS_MODEL_KEY_FILE, $AIOPS_MODEL_KEY or "
        "$AIOPS_MODEL_KEY_PROVIDER.")] = False,
) -> None:
    """Verify a package's signature and every file's digest (no decryption key needed). Exit
    1 and say why if not."""
    from serve.keys import key_provider_from_env
    from serve.packages import check_key, load_public_keys, verify_package

    try:
        verified = verify_package(package, load_public_keys(key))
        enc = verified.encryption
        if decrypt and enc is not None:
            check_key(package, key_provider_from_env(), full=True)
    except AIOpsError as exc:
        raise fail(exc) from exc
    m = verified.manifest
    sealed = "" if enc is None else (
        f", encrypted with key {enc['key_id']!r} ({enc['key_fingerprint']})"
        + (", decrypts" if decrypt else ""))
    console.print(f"OK {m['name']}:{m['version']} ({m['backend']}), {len(m['files'])} files, "
                  f"manifest {verified.digest[:23]}{sealed}")


def register(app: typer.Typer) -> None:
    """Mount these commands at the top level of ``app``."""
    app.command("keygen")(keygen)
    app.command("model-key")(model_key)
    app.command("pack")(pack_cmd)
    app.command("verify")(verify_cmd)

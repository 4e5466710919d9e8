"""Signed model packages: a directory with the artifact files, ``manifest.json`` (sha256 and
size of every file, model identity, reference outputs) and ``manifest.sig`` (Ed25519 over the
manifest's exact bytes).

    pkg/
      manifest.json      {"format": "aiops-package/1", "name", "version", "backend",
                          "artifact": "<file or '.'>", "files": {path: {sha256, size}},
                          "reference": "reference.json" | null}
      manifest.sig       raw 64-byte Ed25519 signature of manifest.json
      reference.json     {"kind", "inputs", "outputs", "tolerance"} (optional)
      <artifact files>

``verify_package`` checks the signature against trusted public keys and every file's digest;
it names the first problem it finds (flipped byte, wrong key, missing or extra file).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aiops.errors import AIOpsError

__all__ = [
    "FORMAT",
    "PackageError",
    "VerifiedPackage",
    "generate_keys",
    "load_public_keys",
    "pack",
    "verify_package",
]

FORMAT = "aiops-package/1"
MANIFEST, SIGNATURE, REFERENCE = "manifest.json", "manifest.sig", "reference.json"


class PackageError(AIOpsError):
    """A package is unsigned, tampered with, signed by an untrusted key, or malformed."""


@dataclass(frozen=True)
class VerifiedPackage:
    root: Path
    manifest: dict[str, Any]
    digest: str
    """sha256 of the manifest: it pins every file, so it identifies the whole package."""

    @property
    def artifact(self) -> Path:
        return self.root / str(self.manifest["artifact"])

    def reference(self) -> dict[str, Any] | None:
        name = self.manifest.get("reference")
        if not name:
            return None
        loaded: dict[str, Any] = json.loads((self.root / name).read_text())
        return loaded


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def generate_keys(directory: Path, name: str = "aiops") -> tuple[Path, Path]:
    """A new Ed25519 key pair as PEM files (the private one readable by its owner only)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    private.touch(mode=0o600, exist_ok=False)
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise PackageError(f"cannot read private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise PackageError(f"{path} is not an Ed25519 private key")
    return key


def load_public_keys(paths: list[Path]) -> list[Ed25519PublicKey]:
    keys = []
    for p in paths:
        try:
            key = serialization.load_pem_public_key(p.read_bytes())
        except (OSError, ValueError) as exc:
            raise PackageError(f"cannot read public key {p}: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise PackageError(f"{p} is not an Ed25519 public key")
        keys.append(key)
    return keys


def pack(artifact: Path, out: Path, *, name: str, version: str, backend: str,
         private_key: Path, reference: dict[str, Any] | None = None) -> Path:
    """Copy ``artifact`` (a file or a directory) into a new package at ``out`` and sign it."""
    if out.exists():
        raise PackageError(f"{out} already exists")
    if not artifact.exists():
        raise PackageError(f"artifact {artifact} does not exist")
    key = _private_key(private_key)
    out.mkdir(parents=True)
    if artifact.is_dir():
        shutil.copytree(artifact, out / "artifact",
                        ignore=shutil.ignore_patterns("__pycache__"))
        rel = "artifact"
    else:
        shutil.copy2(artifact, out / artifact.name)
        rel = artifact.name
    if reference is not None:
        (out / REFERENCE).write_text(json.dumps(reference, indent=1))
    files = {str(p.relative_to(out)): {"sha256": _sha256(p), "size": p.stat().st_size}
             for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "name": name, "version": version, "backend": backend,
                "artifact": rel, "files": files,
                "reference": REFERENCE if reference is not None else None}
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    (out / MANIFEST).write_bytes(body)
    (out / SIGNATURE).write_bytes(key.sign(body))
    return out


def verify_package(root: Path, trusted: list[Ed25519PublicKey]) -> VerifiedPackage:
    """Check signature and digests; raise ``PackageError`` naming the first problem."""
    manifest_path, sig_path = root / MANIFEST, root / SIGNATURE
    if not manifest_path.is_file():
        raise PackageError(f"{root} is not a package: no {MANIFEST}")
    if not sig_path.is_file():
        raise PackageError(f"{root} is unsigned: no {SIGNATURE}")
    body, signature = manifest_path.read_bytes(), sig_path.read_bytes()
    if not trusted:
        raise PackageError("no trusted public keys configured (AIOPS_TRUSTED_KEYS)")
    for key in trusted:
        try:
            key.verify(signature, body)
            break
        except InvalidSignature:
            continue
    else:
        raise PackageError(f"{root}: the signature does not match the manifest under any "
                           "trusted key (tampered manifest or untrusted signer)")
    try:
        manifest = json.loads(body)
    except json.JSONDecodeError as exc:
        raise PackageError(f"{root}: manifest is not JSON: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{root}: unknown package format {manifest.get('format')!r}")
    listed = manifest.get("files", {})
    present = {str(p.relative_to(root)) for p in root.rglob("*")
               if p.is_file() and p.name not in (MANIFEST, SIGNATURE)
               and "__pycache__" not in p.parts}
    extra = sorted(present - set(listed))
    if extra:
        raise PackageError(f"{root}: files not in the manifest: {extra[:5]}")
    for rel, meta in sorted(listed.items()):
        path = root / rel
        if not path.is_file():
            raise PackageError(f"{root}: {rel} is missing")
        if path.stat().st_size != meta["size"] or _sha256(path) != meta["sha256"]:
            raise PackageError(f"{root}: {rel} does not match its sha256 in the manifest")
    return VerifiedPackage(root, manifest, "sha256:" + hashlib.sha256(body).hexdigest())

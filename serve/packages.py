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

Encrypted packages (``pack(..., encrypt=ModelKey)``) keep the layout and the file names; the
artifact's files hold AES-256-GCM ciphertext and the manifest gains ``"encryption": {"alg",
"format", "key_id", "key_fingerprint", "chunk_size", "files"}``. Each file is a header
(magic, version, chunk size, plaintext size) and chunks of ``chunk_size`` plaintext bytes,
each ``nonce (12 random bytes) || ciphertext || tag``; every chunk's associated data is the
header, the package name and version, the file's path, the chunk's index and a last-chunk
flag, so chunks cannot be reordered, dropped or moved between files, versions or packages.
The manifest lists the ciphertext's sha256, so ``verify_package`` needs no key.
``decrypt_artifact`` decrypts chunk by chunk into anonymous memory files (``memfd_create``):
the plaintext never reaches the disk, and memory beyond the model itself stays one chunk.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aiops.errors import AIOpsError
from serve.keys import (
    HOW_TO_CONFIGURE,
    KEY_BYTES,
    KeyProvider,
    KeyUnavailable,
    describe,
    fingerprint,
)

__all__ = [
    "ENCRYPTING_BACKENDS",
    "FORMAT",
    "KeyRefused",
    "ModelKey",
    "PackageError",
    "PlainArtifact",
    "VerifiedPackage",
    "check_key",
    "decrypt_artifact",
    "encryption_of",
    "generate_keys",
    "load_public_keys",
    "pack",
    "verify_package",
]

FORMAT = "aiops-package/1"
MANIFEST, SIGNATURE, REFERENCE = "manifest.json", "manifest.sig", "reference.json"


ALG, ENC_FORMAT, MAGIC = "AES-256-GCM", "aiops-aesgcm/1", b"AIOPSENC"
CHUNK, MAX_CHUNK = 4 << 20, 64 << 20
_HEADER = struct.Struct(">8sBIQ")  # magic, format version, chunk size, plaintext size
_NONCE, _TAG = 12, 16
# Backends that load weights from a path and keep them in memory; vLLM converts a GGUF and
# caches the plaintext on disk, and onnx_ocr loads its models from its own package.
ENCRYPTING_BACKENDS = frozenset({"llama_cpp", "onnx_embedding"})


class PackageError(AIOpsError):
    """A package is unsigned, tampered with, signed by an untrusted key, or malformed."""


class KeyRefused(PackageError):
    """An encrypted package's key is missing, unobtainable or wrong."""


@dataclass(frozen=True)
class ModelKey:
    """The key a package is encrypted with, and the id its manifest records."""

    key_id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class VerifiedPackage:
    root: Path
    manifest: dict[str, Any]
    digest: str
    """sha256 of the manifest: it pins every file, so it identifies the whole package."""

    @property
    def artifact(self) -> Path:
        return self.root / str(self.manifest["artifact"])

    @property
    def encryption(self) -> dict[str, Any] | None:
        enc: dict[str, Any] | None = self.manifest.get("encryption")
        return enc

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
         private_key: Path, reference: dict[str, Any] | None = None,
         encrypt: ModelKey | None = None, chunk_size: int = CHUNK) -> Path:
    """Copy ``artifact`` (a file or a directory) into a new package at ``out`` and sign it;
    with ``encrypt``, the artifact's files are written encrypted (never copied in plaintext)."""
    if out.exists():
        raise PackageError(f"{out} already exists")
    if not artifact.exists():
        raise PackageError(f"artifact {artifact} does not exist")
    if encrypt is not None:
        if backend not in ENCRYPTING_BACKENDS:
            raise PackageError(f"backend {backend!r} cannot serve encrypted weights (it would "
                               f"need them on disk); encrypted: {sorted(ENCRYPTING_BACKENDS)}")
        if len(encrypt.key) != KEY_BYTES:
            raise PackageError(f"an AES-256 key has {KEY_BYTES} bytes, not {len(encrypt.key)}")
        if not 0 < chunk_size <= MAX_CHUNK:
            raise PackageError(f"chunk size must be 1..{MAX_CHUNK} bytes")
    key = _private_key(private_key)
    out.mkdir(parents=True)
    encryption: dict[str, Any] | None = None
    if encrypt is None and artifact.is_dir():
        shutil.copytree(artifact, out / "artifact",
                        ignore=shutil.ignore_patterns("__pycache__"))
        rel = "artifact"
    elif encrypt is None:
        shutil.copy2(artifact, out / artifact.name)
        rel = artifact.name
    else:
        rel = "artifact" if artifact.is_dir() else artifact.name
        sources = ([(p, f"{rel}/{p.relative_to(artifact)}") for p in sorted(artifact.rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts]
                   if artifact.is_dir() else [(artifact, rel)])
        aead = AESGCM(encrypt.key)
        for src, dst in sources:
            (out / dst).parent.mkdir(parents=True, exist_ok=True)
            _encrypt_file(src, out / dst, aead, _context(name, version, dst), chunk_size)
        encryption = {"alg": ALG, "format": ENC_FORMAT, "key_id": encrypt.key_id,
                      "key_fingerprint": fingerprint(encrypt.key), "chunk_size": chunk_size,
                      "files": [dst for _, dst in sources]}
    if reference is not None:
        (out / REFERENCE).write_text(json.dumps(reference, indent=1))
    files = {str(p.relative_to(out)): {"sha256": _sha256(p), "size": p.stat().st_size}
             for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "name": name, "version": version, "backend": backend,
                "artifact": rel, "files": files,
                "reference": REFERENCE if reference is not None else None}
    if encryption is not None:
        manifest["encryption"] = encryption
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
    if "encryption" in manifest:
        _check_encryption(root, manifest)
    return VerifiedPackage(root, manifest, "sha256:" + hashlib.sha256(body).hexdigest())


# -- encryption at rest -------------------------------------------------------------------


def _context(name: str, version: str, rel: str) -> bytes:
    return json.dumps([ENC_FORMAT, name, version, rel], separators=(",", ":")).encode()


def _aad(header: bytes, context: bytes, index: int, last: bool) -> bytes:
    return header + context + struct.pack(">QB", index, last)


def _chunks(size: int, chunk: int) -> list[int]:
    """Plaintext length of each chunk (an empty file is one empty chunk)."""
    n = max(1, -(-size // chunk))
    return [chunk] * (n - 1) + [size - (n - 1) * chunk]


def _encrypt_file(src: Path, dst: Path, aead: AESGCM, context: bytes, chunk: int) -> None:
    size = src.stat().st_size
    header = _HEADER.pack(MAGIC, 1, chunk, size)
    lengths = _chunks(size, chunk)
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        fout.write(header)
        for i, length in enumerate(lengths):
            block = fin.read(length)
            if len(block) != length:
                raise PackageError(f"{src} changed size while it was encrypted")
            nonce = os.urandom(_NONCE)
            fout.write(nonce + aead.encrypt(nonce, block,
                                            _aad(header, context, i, i == len(lengths) - 1)))
        if fin.read(1):
            raise PackageError(f"{src} changed size while it was encrypted")


def _decrypt_file(path: Path, aead: AESGCM, context: bytes, who: str, first_only: bool = False
                  ) -> Iterator[bytes]:
    """The plaintext of an encrypted file, chunk by chunk, each authenticated first."""
    with open(path, "rb") as f:
        header = f.read(_HEADER.size)
        if len(header) != _HEADER.size or header[:8] != MAGIC:
            raise PackageError(f"{who} is not an aiops encrypted file")
        _, version, chunk, size = _HEADER.unpack(header)
        if version != 1 or not 0 < chunk <= MAX_CHUNK:
            raise PackageError(f"{who}: unsupported encrypted-file header "
                               f"(version {version}, chunk {chunk})")
        lengths = _chunks(size, chunk)
        for i, length in enumerate(lengths):
            record = f.read(_NONCE + length + _TAG)
            if len(record) != _NONCE + length + _TAG:
                raise PackageError(f"{who} is truncated at chunk {i} of {len(lengths)}")
            try:
                yield aead.decrypt(record[:_NONCE], record[_NONCE:],
                                   _aad(header, context, i, i == len(lengths) - 1))
            except InvalidTag:
                raise PackageError(f"{who}: chunk {i} fails authentication (the ciphertext "
                                   "or the manifest was altered)") from None
            if first_only:
                return
        if f.read(1):
            raise PackageError(f"{who}: data after its last chunk")


def _check_encryption(root: Path, manifest: dict[str, Any]) -> None:
    enc = manifest["encryption"]
    if not isinstance(enc, dict) or enc.get("alg") != ALG or enc.get("format") != ENC_FORMAT:
        raise PackageError(f"{root}: unknown encryption {enc!r}")
    missing = [f for f in enc.get("files", []) if f not in manifest.get("files", {})]
    if missing or not enc.get("files") or not enc.get("key_fingerprint"):
        raise PackageError(f"{root}: malformed encryption block (files {missing[:3]})")


def encryption_of(root: Path) -> dict[str, Any] | None:
    """The manifest's ``encryption`` block (None: not encrypted, or not a package)."""
    try:
        manifest = json.loads((root / MANIFEST).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PackageError(f"{root}: unreadable manifest: {exc}") from exc
    enc: dict[str, Any] | None = manifest.get("encryption")
    return enc


def _open(root: Path, provider: KeyProvider | None
          ) -> tuple[dict[str, Any], str, AESGCM]:
    """The manifest, who the package is, and its cipher under the provider's key."""
    try:
        manifest = json.loads((root / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise PackageError(f"{root}: unreadable manifest: {exc}") from exc
    if "encryption" not in manifest:
        raise PackageError(f"{root} is not encrypted")
    _check_encryption(root, manifest)
    enc = manifest["encryption"]
    who = f"{manifest.get('name')}:{manifest.get('version')}"
    key_id, want = enc.get("key_id"), enc["key_fingerprint"]
    if provider is None:
        raise KeyRefused(f"{who} is encrypted with key {key_id!r} ({want}) and no key "
                         f"provider is configured: {HOW_TO_CONFIGURE}")
    try:
        key = provider.key_for(str(key_id))
    except KeyUnavailable as exc:
        raise KeyRefused(f"{who} is encrypted with key {key_id!r} ({want}); "
                         f"{describe(provider)} cannot supply it: {exc}") from exc
    got = fingerprint(key) if len(key) == KEY_BYTES else f"{len(key)} bytes"
    if got != want:
        raise KeyRefused(f"{who}: wrong key: the package is encrypted with key {key_id!r} "
                         f"({want}), {describe(provider)} gives {got}")
    return manifest, who, AESGCM(key)


def check_key(root: Path, provider: KeyProvider | None, *, full: bool = False) -> None:
    """Raise ``KeyRefused`` unless ``provider`` has the package's key; authenticate the first
    chunk of each encrypted file (``full``: every chunk), keeping no plaintext."""
    manifest, who, aead = _open(root, provider)
    for rel in manifest["encryption"]["files"]:
        context = _context(manifest["name"], manifest["version"], rel)
        for _ in _decrypt_file(root / rel, aead, context, f"{who}: {rel}", not full):
            pass


@dataclass
class PlainArtifact:
    """A decrypted artifact in memory: ``path`` (a symlink into the memory file, or a private
    directory of them) is what a backend loads; ``close`` releases the memory and the links
    (a backend that mapped the weights keeps its mapping)."""

    path: Path
    fds: list[int]
    links: Path

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())
        shutil.rmtree(self.links, ignore_errors=True)

    def __enter__(self) -> PlainArtifact:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def decrypt_artifact(root: Path, provider: KeyProvider | None) -> PlainArtifact:
    """Decrypt a package's artifact into sealed anonymous memory files (Linux memfd); the
    plaintext is never written to a file system. ``KeyRefused`` for a missing or wrong key,
    ``PackageError`` for ciphertext that fails authentication."""
    manifest, who, aead = _open(root, provider)
    if not hasattr(os, "memfd_create"):
        raise PackageError(f"{who}: decrypting in memory needs Linux (memfd_create)")
    links = Path(tempfile.mkdtemp(prefix="aiops-plain-"))  # 0700, holds only symlinks
    plain = PlainArtifact(links / str(manifest["artifact"]), [], links)
    try:
        for rel in manifest["encryption"]["files"]:
            fd = os.memfd_create(f"aiops:{who}:{rel}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            plain.fds.append(fd)
            context = _context(manifest["name"], manifest["version"], rel)
            for block in _decrypt_file(root / rel, aead, context, f"{who}: {rel}"):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)  # read-only from here on
            link = links / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"/proc/self/fd/{fd}")
    except BaseException:
        plain.close()
        raise
    return plain

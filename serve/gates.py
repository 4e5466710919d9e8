"""Validation gates a model version passes before it takes traffic.

1. Static, in the control plane before anything deploys: the artifact resolves and reads; a
   bundle's signature and digests verify (required in strict mode); the replica's resources
   fit the cluster.
2. At run time, in the new version's own replica (its real environment) while the ingress
   routes nothing to it: a sample inference per capability, with its latency, and numeric
   consistency against the reference outputs stored in its package (embeddings: L2 distance
   <= tolerance, default 1e-4; generated or recognised text: equal under greedy decoding).

A failure raises ``GateFailed`` naming the version and the reason; the version does not serve.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiops.errors import AIOpsError
from serve.keys import KeyUnavailable, key_provider_from_env
from serve.packages import (
    PackageError,
    check_key,
    encryption_of,
    load_public_keys,
    verify_package,
)
from serve.specs import ModelSpec, SpecError

__all__ = ["GateFailed", "Trust", "compare_reference", "sample_image", "static_checks"]

DEFAULT_TOLERANCE = 1e-4


class GateFailed(AIOpsError):
    """A version failed a validation gate; it does not take traffic."""


@dataclass(frozen=True)
class Trust:
    strict: bool = False
    keys: tuple[Path, ...] = ()

    @classmethod
    def from_setting(cls, strict: bool, keys: str) -> Trust:
        return cls(strict, tuple(Path(k.strip()) for k in keys.split(",") if k.strip()))


def static_checks(spec: ModelSpec, trust: Trust, cluster_cpus: float) -> None:
    who = f"{spec.name}:{spec.version}"
    artifact = spec.artifact
    if trust.strict and (artifact is None or artifact.bundle is None):
        raise GateFailed(f"{who}: strict mode serves only signed packages "
                         "(artifact.bundle); this version has none")
    if artifact is not None:
        if artifact.bundle is not None:
            try:
                keys = load_public_keys(list(trust.keys))
                if trust.strict or keys:
                    verify_package(artifact.bundle, keys)
                if encryption_of(artifact.bundle) is not None:
                    # Before anything deploys: the key is there and opens this package.
                    check_key(artifact.bundle, key_provider_from_env())
            except (PackageError, KeyUnavailable) as exc:
                raise GateFailed(f"{who}: package refused: {exc}") from exc
        try:
            path = artifact.resolve()
            if path.is_file():
                with open(path, "rb") as f:
                    f.read(1)
        except (SpecError, OSError) as exc:
            raise GateFailed(f"{who}: artifact unreadable: {exc}") from exc
    need = spec.resources.num_cpus * max(spec.autoscaling.min_replicas, 1)
    if need > cluster_cpus:
        raise GateFailed(f"{who}: needs {need:g} CPUs for its minimum replicas, the cluster "
                         f"has {cluster_cpus:g}")


def sample_image(text: str = "OK 42") -> bytes:
    """A small PNG with text on it, for a vision model's sample inference."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (320, 96), "white")
    ImageDraw.Draw(img).text((16, 24), text, fill="black", font=ImageFont.load_default(size=36))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def decode_image(value: str) -> bytes:
    return base64.b64decode(value)


def compare_reference(kind: str, expected: list[Any], actual: list[Any],
                      tolerance: float = DEFAULT_TOLERANCE) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise why not."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs for {len(expected)} reference inputs"
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if kind == "embedding":
            if len(want) != len(got):
                return f"input {i}: dimension {len(got)} != reference {len(want)}"
            dist = math.sqrt(sum((a - b) ** 2 for a, b in zip(want, got, strict=True)))
            if dist > tolerance:
                return f"input {i}: L2 distance {dist:.3g} to the reference exceeds {tolerance:g}"
        elif want != got:
            return f"input {i}: output {got!r} differs from the reference {want!r}"
    return None


def reference_kind(spec: ModelSpec) -> str:
    caps = spec.capabilities
    return "embedding" if "embeddings" in caps else "text" if "chat" in caps else "vision"


def reference_outputs(backend: Any, kind: str, inputs: list[Any], max_tokens: int = 16
                      ) -> list[Any]:
    """What ``backend`` answers for reference ``inputs`` (greedy, so it is repeatable): the
    same function records the reference at pack time and checks it at deploy time."""
    from serve.backends.base import ChatMessage, GenerationRequest

    if kind == "embedding":
        vectors: list[Any] = backend.embed(list(inputs)).vectors
        return vectors
    if kind == "vision":
        return [backend.see([decode_image(x)], "").text for x in inputs]
    return [backend.generate(GenerationRequest(
        messages=(ChatMessage("user", x),), max_tokens=max_tokens, temperature=0.0,
        seed=0)).text for x in inputs]


def default_reference_inputs(kind: str) -> list[Any]:
    if kind == "embedding":
        return ["the GPU ran out of memory", "p99 latency of the chat model doubled"]
    if kind == "vision":
        return [base64.b64encode(sample_image("replica restarted")).decode()]
    return ["Paris is the capital of which country?"]

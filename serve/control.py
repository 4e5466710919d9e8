"""The Serve control plane: the desired state of every model version, and the operations that
change it (apply a spec file, canary, set weights, promote, roll back, set faults).

It lives in the Serve driver process, which owns the Ray instance. Every operation validates
first, then deploys the whole desired state declaratively; Serve changes only what differs
(see ``serve.app``). Operations are serialised; a refused one changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aiops.control_status import ControlStatus, ModelStatus, ReplicaBounds, VersionStatus
from aiops.errors import AIOpsError
from serve.app import deploy_config
from serve.gates import GateFailed, Trust, static_checks
from serve.specs import Autoscaling, Faults, ModelSpec, Priority, SpecFile
from serve.telemetry import TelemetryConfig

__all__ = ["ControlError", "DeployFailed", "GateRefused", "NotFound", "ServeControl"]

log = logging.getLogger(__name__)


class ControlError(AIOpsError):
    """An operation was refused; nothing changed."""


class NotFound(ControlError):
    """The model or version does not exist."""


class DeployFailed(ControlError):
    """Serve could not bring the new state up."""


class GateRefused(ControlError):
    """A version failed a validation gate and does not serve."""


Deployer = Callable[[dict[str, Any]], None]
# Runs the run-time gate in a version's replica: {"ok": bool, "reason"?: str, ...}.
Tester = Callable[[ModelSpec], dict[str, Any]]


class ServeControl:
    def __init__(self, specs: list[ModelSpec], telemetry: TelemetryConfig,
                 ingress_args: dict[str, Any], deployer: Deployer,
                 state_file: Path | None = None, tester: Tester | None = None,
                 trust: Trust | None = None, cluster_cpus: float = float("inf")) -> None:
        self._specs = list(specs)
        self._telemetry = telemetry
        self._ingress_args = ingress_args
        self._deployer = deployer
        self._state_file = state_file
        self._tester = tester
        self._trust = trust or Trust()
        self._cluster_cpus = cluster_cpus
        self.gate_reports: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        # The version that takes the traffic when a canary is rolled back, per model.
        self.stable: dict[str, str] = {}
        self._remember_stable()

    # -- reading ---------------------------------------------------------------------------

    @property
    def specs(self) -> list[ModelSpec]:
        return list(self._specs)

    def status(self) -> ControlStatus:
        models: dict[str, list[VersionStatus]] = {}
        for s in self._specs:
            models.setdefault(s.name, []).append(VersionStatus(
                version=s.version, weight=_weight(s), backend=s.backend,
                deployment=s.deployment_name,
                digest=s.artifact.digest() if s.artifact is not None else None,
                autoscaling=ReplicaBounds(min_replicas=s.autoscaling.min_replicas,
                                          max_replicas=s.autoscaling.max_replicas),
                faults=s.faults.model_dump(exclude_defaults=True),
                shed=[p.value for p in s.shed]))
        return ControlStatus(models={
            name: ModelStatus(stable=self.stable.get(name), versions=versions)
            for name, versions in models.items()})

    # -- operations ------------------------------------------------------------------------

    def deploy(self) -> None:
        """Deploy the current desired state (at start-up): every version passes its gates
        before the ingress routes to it."""
        with self._lock:
            self._static(self._specs)
            staged = frozenset(s.deployment_name for s in self._specs)
            self._deploy(self._specs, unrouted=staged)
            self._run_gates(self._specs)
            self._deploy(self._specs)

    def apply(self, specs: list[ModelSpec]) -> dict[str, list[str]]:
        """Replace the desired state with a validated spec list; gates run on new or changed
        versions before any of them takes traffic. Returns what changed."""
        with self._lock:
            self._validate(specs)
            old = {(s.name, s.version): s for s in self._specs}
            new = {(s.name, s.version): s for s in specs}
            changed = [s for k, s in new.items()
                       if k not in old or _static(old[k]) != _static(s)]
            added = frozenset(s.deployment_name for k, s in new.items() if k not in old)
            self._static(changed)
            previous = self._specs
            # New versions come up unrouted; changed ones update in place (rolling).
            self._deploy(specs, unrouted=added)
            try:
                self._run_gates(changed)
            except GateRefused:
                self._deploy(previous)
                raise
            self._deploy(specs)
            self._remember_stable()
            return {
                "added": [f"{n}:{v}" for n, v in new if (n, v) not in old],
                "changed": [f"{n}:{v}" for n, v in new if (n, v) in old
                            and old[(n, v)] != new[(n, v)]],
                "removed": [f"{n}:{v}" for n, v in old if (n, v) not in new],
            }

    def set_traffic(self, model: str, weights: dict[str, int]) -> None:
        with self._lock:
            versions = self._versions(model)
            unknown = set(weights) - {s.version for s in versions}
            if unknown:
                raise NotFound(f"model {model!r} has no version(s) {sorted(unknown)}")
            full = {s.version: weights.get(s.version, 0) for s in versions}
            if sum(full.values()) != 100 or any(w < 0 for w in full.values()):
                raise ControlError(f"weights must be >= 0 and add up to 100, got {full}")
            self._retraffic(model, full)

    def canary(self, model: str, version: str, percent: int) -> None:
        """Send ``percent`` of the model's traffic to ``version``, the rest to the stable one."""
        if not 0 <= percent <= 100:
            raise ControlError("percent must be between 0 and 100")
        with self._lock:
            versions = {s.version for s in self._versions(model)}
            if version not in versions:
                raise NotFound(f"model {model!r} has no version {version!r}; "
                               "add it with `aiops models apply` first")
            stable = self.stable.get(model)
            if stable is None or stable == version:
                raise ControlError(f"no stable version of {model!r} other than {version!r} "
                                   "to share traffic with")
            self._retraffic(model, {stable: 100 - percent, version: percent})

    def promote(self, model: str, version: str) -> None:
        """Give ``version`` all of the model's traffic and make it the stable version."""
        with self._lock:
            if version not in {s.version for s in self._versions(model)}:
                raise NotFound(f"model {model!r} has no version {version!r}")
            self._retraffic(model, {version: 100})
            self.stable[model] = version

    def rollback(self, model: str) -> str:
        """Give the stable version all of the model's traffic; return its version."""
        with self._lock:
            self._versions(model)
            stable = self.stable.get(model)
            if stable is None:
                raise ControlError(f"model {model!r} has no stable version to roll back to")
            self._retraffic(model, {stable: 100})
            return stable

    def set_faults(self, model: str, version: str, faults: dict[str, Any]) -> None:
        with self._lock:
            try:
                parsed = Faults.model_validate(faults)
            except ValidationError as exc:
                raise ControlError(f"invalid faults: {exc.errors()[0]['msg']}") from exc
            target = self._version(model, version)
            specs = [s.model_copy(update={"faults": parsed}) if s is target else s
                     for s in self._specs]
            self._deploy(specs)

    def restart_replica(self, model: str, version: str, replica: str | None = None) -> str:
        """Stop one replica of a version gracefully (the one named, else the first); Serve
        starts a fresh one in its place. Returns the replica id stopped."""
        import ray

        deployment = self._version(model, version).deployment_name
        prefix = f"SERVE_REPLICA::{deployment}#{deployment}#"
        from ray._private import state

        names = sorted(a["Name"] for a in state.actors().values()
                       if a.get("State") == "ALIVE" and (a.get("Name") or "").startswith(prefix))
        ids = [n.removeprefix(prefix) for n in names]
        if not ids:
            raise NotFound(f"{model} {version} has no running replica")
        chosen = replica or ids[0]
        if chosen not in ids:
            raise NotFound(f"{model} {version} has no replica {chosen!r} (running: "
                           f"{', '.join(ids)})")
        handle = ray.get_actor(prefix + chosen, namespace="serve")
        # __ray_terminate__ exits the actor's process cleanly (exit 0: not a crash to the
        # eBPF collector); Serve's controller sees the replica gone and replaces it.
        handle.__ray_terminate__.remote()
        log.info("restarting %s %s replica %s", model, version, chosen)
        return chosen

    def shed(self, model: str, classes: list[str]) -> None:
        """Refuse these priority classes of MODEL at the ingress (in place; [] lifts it)."""
        with self._lock:
            try:
                parsed = sorted({Priority(c) for c in classes})
            except ValueError as exc:
                raise ControlError(f"shed: priority classes are "
                                   f"{', '.join(p.value for p in Priority)}") from exc
            versions = self._versions(model)
            specs = [s.model_copy(update={"shed": parsed}) if s in versions else s
                     for s in self._specs]
            self._deploy(specs)

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int) -> None:
        """New autoscaling bounds for one version (its replicas are redeployed; the other
        versions and models are untouched)."""
        with self._lock:
            target = self._version(model, version)
            try:
                bounds = Autoscaling.model_validate({**target.autoscaling.model_dump(),
                                                     "min_replicas": min_replicas,
                                                     "max_replicas": max_replicas})
            except ValidationError as exc:
                raise ControlError(f"invalid scale: {exc.errors()[0]['msg']}") from exc
            specs = [s.model_copy(update={"autoscaling": bounds}) if s is target else s
                     for s in self._specs]
            self._deploy(specs)

    # -- internals -------------------------------------------------------------------------

    def _versions(self, model: str) -> list[ModelSpec]:
        versions = [s for s in self._specs if s.name == model]
        if not versions:
            raise NotFound(f"model {model!r} does not exist")
        return versions

    def _version(self, model: str, version: str) -> ModelSpec:
        for s in self._versions(model):
            if s.version == version:
                return s
        raise NotFound(f"model {model!r} has no version {version!r}")

    def _retraffic(self, model: str, weights: dict[str, int]) -> None:
        specs = [s.model_copy(update={"traffic": weights.get(s.version, 0)})
                 if s.name == model else s for s in self._specs]
        self._validate(specs)
        self._deploy(specs)

    def _validate(self, specs: list[ModelSpec]) -> None:
        try:
            SpecFile(models=specs)
        except ValidationError as exc:
            raise ControlError("; ".join(e["msg"] for e in exc.errors())) from exc

    def _static(self, specs: list[ModelSpec]) -> None:
        for s in specs:
            try:
                static_checks(s, self._trust, self._cluster_cpus)
            except GateFailed as exc:
                raise GateRefused(str(exc)) from exc

    def _run_gates(self, specs: list[ModelSpec]) -> None:
        if self._tester is None:
            return
        for s in specs:
            report = self._tester(s)
            self.gate_reports[f"{s.name}:{s.version}"] = report
            if not report.get("ok"):
                raise GateRefused(f"{s.name}:{s.version} failed its validation gate: "
                                  f"{report.get('reason')}")
            log.info("%s:%s passed its gates: %s", s.name, s.version, report)

    def _deploy(self, specs: list[ModelSpec], unrouted: frozenset[str] = frozenset()) -> None:
        config = deploy_config(specs, self._telemetry, self._ingress_args, unrouted,
                               self._trust)
        started = time.monotonic()
        self._deployer(config)
        self._specs = list(specs)
        log.info("deployed %d model version(s) in %.1f s", len(specs),
                 time.monotonic() - started)
        if self._state_file is not None:
            self._state_file.write_text(json.dumps(
                {"stable": self.stable, "specs": [s.model_dump(mode="json") for s in specs]},
                indent=2))

    def _remember_stable(self) -> None:
        for s in self._specs:
            versions = [v for v in self._specs if v.name == s.name]
            current = self.stable.get(s.name)
            if current not in {v.version for v in versions}:
                self.stable[s.name] = max(versions, key=_weight).version


def _weight(s: ModelSpec) -> int:
    return 100 if s.traffic is None else s.traffic


def _static(s: ModelSpec) -> ModelSpec:
    """The part of a spec whose change needs the version redeployed (and gated again)."""
    return s.model_copy(update={"traffic": None, "faults": Faults(), "shed": []})

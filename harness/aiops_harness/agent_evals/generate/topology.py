"""The serving topology: replicas, deployments (a model version), the requests they serve,
and the id and time helpers the rows use."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiops_harness.agent_evals.generate.model import NS, SDK, Model


@dataclass
class Replica:
    id: str
    pid: int
    up_ns: int
    down_ns: int | None = None  # the process exited

    def alive(self, t: int) -> bool:
        return self.up_ns <= t and (self.down_ns is None or t < self.down_ns)


@dataclass
class Deployment:
    model: Model
    version: str
    replicas: list[Replica]

    @property
    def name(self) -> str:
        return f"{self.model.name}-{self.version}"

    def resource(self, r: Replica) -> dict[str, Any]:
        out: dict[str, Any] = {
            "service.name": self.model.name, "service.version": self.version,
            "service.instance.id": r.id, "ray.serve.app": self.name,
            "ray.serve.deployment": self.name, "ray.serve.replica": r.id, **SDK}
        if self.model.artifact:
            out["aiops.model.artifact_digest"] = self.model.digest(self.version)
        return out

    def labels(self) -> dict[str, Any]:
        return {"gen_ai.request.model": self.model.name, "aiops.model.version": self.version,
                "aiops.model.artifact_digest": self.model.digest(self.version)}

    def process(self, r: Replica) -> dict[str, Any]:
        """eBPF attributes of the replica's process (collectors.ebpf.attribution)."""
        return {"process.pid": r.pid, "process.command": "ray::ServeRepli",
                "ray.serve.app": self.name, "ray.serve.deployment": self.name,
                "ray.serve.replica": r.id, "gen_ai.request.model": self.model.name,
                "aiops.model.version": self.version}


@dataclass
class Req:
    """One request as it went through the ingress and (maybe) a replica."""

    t: int  # ingress span start
    dep: Deployment | None
    replica: Replica | None
    tokens_in: int
    tokens_out: int
    model_ms: float
    ttft_ms: float = 0.0
    queue_ms: float = 0.0  # waited at the ingress's admission gate
    net_ms: float = 0.0  # extra time on the wire between ingress and replica
    status: int = 200
    error: str | None = None  # the model raised this (span error, ERROR log, 500)
    refusal: str | None = None  # the ingress answered ``status`` without calling the model
    lost: str | None = None  # the replica died under it: no model span or log, ingress 500
    stream: bool = False
    prompt: str | None = None  # recorded as gen_ai.prompt (prompt capture on)
    finish: str = "stop"
    route: str | None = None

    @property
    def version(self) -> str | None:
        return self.dep.version if self.dep else None


Fault = Callable[[Req, random.Random], None]


def hex_id(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def replica_id(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))


def to_us(ns: float) -> int:
    """Microsecond resolution: the low digits of a nanosecond clock only cost bytes."""
    return int(ns) // 1000 * 1000


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def to_ns(t: datetime) -> int:
    return int(t.timestamp()) * NS


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns // NS, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

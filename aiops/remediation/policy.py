"""Policy as code: per action type and target, off / dry-run / approve / auto, with cooldowns,
rate limits, blast-radius limits and time windows. The first rule that matches an action
(type and target glob) decides; none matching means ``default_mode`` (dry-run unless changed).
A refusal names the rule and the limit that refused it."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aiops.errors import ConfigError

__all__ = ["DEFAULT_POLICY", "Decision", "Mode", "Policy", "Rule", "load_policy"]

DEFAULT_POLICY = Path(__file__).with_name("policy.yaml")
DEMO_POLICY = Path(__file__).with_name("policy-demo.yaml")


class Mode(StrEnum):
    OFF = "off"
    DRY_RUN = "dry_run"
    APPROVE = "approve"
    AUTO = "auto"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Rule(_Strict):
    id: str
    action: str = Field(description="rollback, shift_traffic, promote, scale, ... or *")
    target: str = Field("*", description="Model name glob.")
    mode: Mode
    cooldown_s: float = Field(0.0, ge=0, description="Least time between two executions.")
    max_per_hour: int | None = Field(None, ge=0)
    max_replicas: int | None = Field(None, ge=1, description="Scale never above this.")
    windows: list[str] = Field(default_factory=list,
                               description="UTC 'HH:MM-HH:MM' when it may act; empty: always.")

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str]) -> list[str]:
        for w in value:
            _parse_window(w)
        return value

    def matches(self, action: str, target: str) -> bool:
        return self.action in ("*", action) and fnmatch.fnmatchcase(target, self.target)


def _parse_window(text: str) -> tuple[time, time]:
    try:
        start, end = (time.fromisoformat(p.strip()) for p in text.split("-"))
    except ValueError as exc:
        raise ValueError(f"time window {text!r}: expected 'HH:MM-HH:MM' (UTC)") from exc
    return start, end


@dataclass(frozen=True)
class Decision:
    mode: Mode  # what happens: off/dry_run record only, approve waits, auto executes
    rule: str  # the rule that decided ("default" when none matched)
    reason: str

    @property
    def denied(self) -> bool:
        return self.mode is Mode.OFF


@dataclass(frozen=True)
class Past:
    """An earlier action, as the policy needs it: what, on what, when, and whether it ran."""

    kind: str
    target: str
    time_ns: int
    executed: bool
    in_flight: bool  # executed and not yet verified or failed


class Policy(_Strict):
    default_mode: Mode = Mode.DRY_RUN
    approval_ttl_s: float = Field(600.0, gt=0)
    verify_s: float = Field(120.0, gt=0, description="Time the SLI has to recover.")
    max_concurrent: dict[str, int] = Field(
        default_factory=lambda: {"rollback": 1},
        description="Per action type: executions in flight at once (blast radius).")
    rules: list[Rule] = Field(default_factory=list)

    def decide(self, kind: str, target: str, now_ns: int, history: Sequence[Past],
               replicas: int | None = None) -> Decision:
        rule = next((r for r in self.rules if r.matches(kind, target)), None)
        if rule is None:
            return Decision(self.default_mode, "default", f"no rule matches {kind} on {target}")
        if rule.mode is Mode.OFF:
            return Decision(Mode.OFF, rule.id, f"rule {rule.id} turns {kind} off")
        refusal = self._limits(rule, kind, target, now_ns, history, replicas)
        if refusal:
            return Decision(Mode.OFF, rule.id, refusal)
        return Decision(rule.mode, rule.id, f"rule {rule.id}: {rule.mode}")

    def _limits(self, rule: Rule, kind: str, target: str, now_ns: int,
                history: Sequence[Past], replicas: int | None) -> str | None:
        done = [p for p in history if p.kind == kind and p.target == target and p.executed]
        if rule.cooldown_s and done:
            since = (now_ns - max(p.time_ns for p in done)) / 1e9
            if since < rule.cooldown_s:
                return (f"rule {rule.id}: cooldown, last {kind} on {target} {since:.0f} s ago "
                        f"(cooldown {rule.cooldown_s:g} s)")
        if rule.max_per_hour is not None:
            hour = [p for p in done if now_ns - p.time_ns < 3600 * 10**9]
            if len(hour) >= rule.max_per_hour:
                return f"rule {rule.id}: rate limit, {len(hour)} {kind} in the last hour"
        limit = self.max_concurrent.get(kind)
        if limit is not None:
            flying = [p for p in history if p.kind == kind and p.in_flight]
            if len(flying) >= limit:
                return (f"rule {rule.id}: blast radius, {len(flying)} {kind} already in "
                        f"flight (max_concurrent {limit})")
        if rule.max_replicas is not None and replicas is not None and \
                replicas > rule.max_replicas:
            return f"rule {rule.id}: {replicas} replicas exceeds max_replicas {rule.max_replicas}"
        if rule.windows and not any(_inside(w, now_ns) for w in rule.windows):
            return f"rule {rule.id}: outside its time windows {rule.windows} (UTC)"
        return None


def _inside(window: str, now_ns: int) -> bool:
    start, end = _parse_window(window)
    now = datetime.fromtimestamp(now_ns / 1e9, UTC).time()
    return start <= now < end if start <= end else (now >= start or now < end)


def load_policy(path: Path | None) -> Policy:
    """Read a policy file; a ConfigError names the file and the field that is wrong."""
    path = path or DEFAULT_POLICY
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        return Policy.model_validate(doc)
    except OSError as exc:
        raise ConfigError(f"cannot read policy file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"policy file {path} is not valid YAML: {exc}") from exc
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise ConfigError(f"policy file {path}: {where}: {e['msg']}") from exc

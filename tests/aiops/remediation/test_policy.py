"""The remediation policy: modes per action and target, and every limit names its rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiops.errors import ConfigError
from aiops.remediation.policy import DEFAULT_POLICY, DEMO_POLICY, Mode, Past, Policy, load_policy

NS = 1_000_000_000
NOON = 1_800_000_000 * NS - (1_800_000_000 % 86400) * NS + 12 * 3600 * NS  # 12:00 UTC

POLICY = Policy.model_validate({"rules": [
    {"id": "no-prod-rollback", "action": "rollback", "target": "prod-*", "mode": "off"},
    {"id": "rollback", "action": "rollback", "target": "*", "mode": "auto", "cooldown_s": 300,
     "max_per_hour": 2},
    {"id": "scale", "action": "scale", "target": "*", "mode": "approve", "max_replicas": 4,
     "windows": ["08:00-18:00"]},
]})


def test_the_default_policy_dry_runs_everything() -> None:
    policy = load_policy(DEFAULT_POLICY)
    d = policy.decide("rollback", "echo", NOON, [])
    assert (d.mode, d.rule) == (Mode.DRY_RUN, "default")


def test_the_first_matching_rule_decides_and_a_refusal_names_it() -> None:
    d = POLICY.decide("rollback", "prod-chat", NOON, [])
    assert d.denied and d.rule == "no-prod-rollback" and "off" in d.reason
    assert POLICY.decide("rollback", "echo", NOON, []).mode is Mode.AUTO


def test_a_cooldown_is_respected() -> None:
    past = [Past("rollback", "echo", NOON - 100 * NS, executed=True, in_flight=False)]
    d = POLICY.decide("rollback", "echo", NOON, past)
    assert d.denied and "cooldown" in d.reason and "rollback" in d.rule
    assert POLICY.decide("rollback", "echo", NOON + 201 * NS, past).mode is Mode.AUTO


def test_a_rate_limit_counts_the_last_hour() -> None:
    past = [Past("rollback", "echo", NOON - k * 1000 * NS, True, False) for k in (1, 2)]
    assert "rate limit" in POLICY.decide("rollback", "echo", NOON, past).reason


def test_one_rollback_at_a_time() -> None:
    flying = [Past("rollback", "other", NOON - 10 * NS, executed=True, in_flight=True)]
    d = POLICY.decide("rollback", "echo", NOON, flying)
    assert d.denied and "blast radius" in d.reason


def test_scale_is_bounded_and_only_in_its_window() -> None:
    assert POLICY.decide("scale", "echo", NOON, [], replicas=3).mode is Mode.APPROVE
    assert "max_replicas 4" in POLICY.decide("scale", "echo", NOON, [], replicas=5).reason
    night = NOON + 10 * 3600 * NS
    assert "time windows" in POLICY.decide("scale", "echo", night, [], replicas=2).reason


def test_a_bad_policy_file_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("rules: [{id: x, action: rollback, mode: sometimes}]\n")
    with pytest.raises(ConfigError, match=r"policy.yaml: rules.0.mode"):
        load_policy(bad)
    bad.write_text("rules: [{id: x, action: scale, mode: auto, windows: ['9-5']}]\n")
    with pytest.raises(ConfigError, match="HH:MM-HH:MM"):
        load_policy(bad)


def test_the_demo_profile_rolls_back_on_its_own() -> None:
    assert load_policy(DEMO_POLICY).decide("rollback", "echo", NOON, []).mode is Mode.AUTO


def test_an_action_moves_only_forward_through_its_states() -> None:
    from aiops.remediation.actions import ActionStatus as S

    assert S.NEW.can_become(S.PROPOSED) and S.PROPOSED.can_become(S.PENDING)
    assert S.PENDING.can_become(S.APPROVED) and S.APPROVED.can_become(S.EXECUTED)
    assert S.EXECUTED.can_become(S.VERIFIED) and S.EXECUTED.can_become(S.FAILED)
    # No way back, and nothing after an end.
    assert not S.VERIFIED.can_become(S.EXECUTED)
    assert not S.DENIED.can_become(S.APPROVED)
    assert not S.PROPOSED.can_become(S.EXECUTED)  # never executed without an approval
    assert not any(end.can_become(s) for end in (S.DENIED, S.DRY_RUN, S.EXPIRED, S.WITHDRAWN,
                                                 S.VERIFIED, S.FAILED) for s in S)

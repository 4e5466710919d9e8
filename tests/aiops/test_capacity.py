"""A load against a model's limits, by Serve's own autoscaling rule: desired replicas =
ceil(requests in service / target_ongoing_requests), within min/max_replicas; past
max_replicas x max_ongoing_requests requests wait."""

from __future__ import annotations

import pytest

from aiops.capacity import Capacity, Fit, plan

CHAT = Capacity("chat", min_replicas=1, max_replicas=2, target_ongoing=1.0, max_ongoing=2)


def test_a_load_within_max_replicas_at_target_fits() -> None:
    p = plan(1.6, CHAT)
    assert p is not None and (p.wanted, p.replicas, p.fit) == (2, 2, Fit.FITS)
    assert p.headroom_target == pytest.approx(2 / 1.6)
    assert p.headroom_slots == pytest.approx(4 / 1.6)


def test_more_than_max_replicas_want_but_within_their_slots_runs_above_target() -> None:
    p = plan(3.0, CHAT)
    assert p is not None and (p.wanted, p.replicas, p.fit) == (3, 2, Fit.ABOVE_TARGET)


def test_more_than_every_slot_is_over() -> None:
    p = plan(4.5, CHAT)
    assert p is not None and (p.wanted, p.fit) == (5, Fit.OVER)


def test_min_replicas_bound_the_plan_from_below_and_an_exact_multiple_does_not_round_up() -> None:
    p = plan(0.1, Capacity("embed", min_replicas=2, max_replicas=4, target_ongoing=2.0))
    assert p is not None and p.wanted == 2
    exact = plan(2.0, CHAT)
    assert exact is not None and exact.wanted == 2


def test_no_autoscaling_limits_no_plan() -> None:
    assert plan(1.0, Capacity("attached-app")) is None

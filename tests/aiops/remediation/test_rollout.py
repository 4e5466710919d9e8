"""The progressive canary's gate: sound on few samples, one-sided, with an effect size."""

from __future__ import annotations

import random

from aiops.remediation.rollout import Gate, compare
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_spans, span


def _traffic(store: Store, version: str, n: int, ms: float, failed: int = 0,
             seed: int = 1) -> None:
    rng = random.Random(seed)
    add_spans(store, [span(T0 + i * NS // 2, ms * rng.uniform(0.8, 1.25), version=version,
                           status=500 if i < failed else 200) for i in range(n)])


def test_a_slower_canary_is_a_breach_even_on_a_handful_of_requests(store: Store) -> None:
    _traffic(store, "v1", 60, 50)
    _traffic(store, "v2", 8, 400, seed=2)
    v = compare(store, "echo", "v1", "v2", T0, T0 + 60 * NS)
    assert v.ok is False and v.reason.startswith("latency") and v.p_latency < 0.001


def test_a_failing_canary_is_a_breach(store: Store) -> None:
    _traffic(store, "v1", 60, 50)
    _traffic(store, "v2", 10, 50, failed=4, seed=2)
    v = compare(store, "echo", "v1", "v2", T0, T0 + 60 * NS)
    assert v.ok is False and v.reason.startswith("errors") and v.p_errors < 0.01


def test_a_canary_like_stable_passes_and_a_slightly_slower_one_too(store: Store) -> None:
    _traffic(store, "v1", 60, 50)
    _traffic(store, "v2", 20, 55, seed=2)  # 10% slower: below the effect size
    v = compare(store, "echo", "v1", "v2", T0, T0 + 60 * NS)
    assert v.ok is True, v.reason


def test_too_few_requests_is_no_verdict(store: Store) -> None:
    _traffic(store, "v1", 60, 50)
    _traffic(store, "v2", 3, 400, seed=2)
    v = compare(store, "echo", "v1", "v2", T0, T0 + 60 * NS, Gate(min_samples=8))
    assert v.ok is None and "too few" in v.reason


def test_a_significant_but_tiny_slowdown_is_not_a_breach(store: Store) -> None:
    _traffic(store, "v1", 300, 1.0)
    _traffic(store, "v2", 300, 1.5, seed=2)  # 50% slower, but half a millisecond
    v = compare(store, "echo", "v1", "v2", T0, T0 + 200 * NS)
    assert v.p_latency < 0.01 and v.ok is True, v.reason

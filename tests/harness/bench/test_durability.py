"""`aiops bench durability` with tiny parameters: one kill -9 round, a short flood, a short
slow-upload attack, each against a real `aiops server` subprocess on loopback."""

from __future__ import annotations

import pytest

from aiops_harness.bench.durability import (
    numbered,
    run_durability,
    run_overload,
    run_slow_upload,
    tally,
    template,
)


def test_numbered_requests_carry_their_number_in_every_span_id() -> None:
    body = template(3)
    assert numbered(body, 0x01020304).count(b"\x12\x08\x01\x02\x03\x04") == 3


@pytest.mark.slow
def test_durability_overload_and_slow_uploads_tiny() -> None:
    d = run_durability(rounds=1, seconds=1.0, spans_per_request=200)
    assert d.acked_spans > 0 and d.lost == 0
    o = run_overload(clients=8, requests_per_client=2)
    assert set(o.statuses) <= {200, 503} and o.retry_after_on_every_503
    assert o.status_after == 200
    s = run_slow_upload(read_timeout_s=1.0, attack_s=1.5, clients=2)
    assert s.statuses.get(200, 0) > 0 and tally(s.statuses).endswith("/ 0 / 0")
    assert [head.split()[1] for head, _ in s.cut_off] == ["408", "408"]

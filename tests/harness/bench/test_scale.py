"""`aiops bench scale` at a small size: the store it writes, the incident its detection round
must find in it, and every query answering over it."""

from __future__ import annotations

import time
from pathlib import Path

from aiops_harness.bench.scale import ScaleConfig, build_store, run_queries, run_scale

SMALL = ScaleConfig(spans=120_000, logs=80_000, hours=0.5, batch_rows=40_000, repetitions=2)


def test_the_store_holds_the_rows_asked_for_in_time_order(tmp_path: Path) -> None:
    now = time.time_ns()
    store, sample = build_store(tmp_path / "s.duckdb", SMALL, now)
    try:
        assert store.query("SELECT count(*) FROM spans").rows == [(120_000,)]
        assert store.query("SELECT count(*) FROM logs").rows == [(80_000,)]
        # Two spans per trace, the model's a child of the ingress span.
        assert store.query("SELECT count(DISTINCT trace_id), count(*) FILTER (WHERE "
                           "parent_span_id IS NULL) FROM spans").rows == [(60_000, 60_000)]
        [(first, last)] = store.query("SELECT epoch_ns(min(start_time)), "
                                      "epoch_ns(max(start_time)) FROM spans").rows
        assert now - 1800 * 10**9 <= first and last <= now
        assert len(sample) == 3 * 50 and all(len(t) == 32 for t in sample)
    finally:
        store.close()


def test_the_queries_find_the_slow_canary_and_answer(tmp_path: Path) -> None:
    now = time.time_ns()
    store, sample = build_store(tmp_path / "s.duckdb", SMALL, now)
    try:
        latencies, found = run_queries(store, now, sample, repetitions=2)
    finally:
        store.close()
    assert found == ["model-0@v2 latency"]
    assert set(latencies) == {"detect", "evidence", "slis", "dashboard", "trace (last hour)",
                              "trace (any age)", "logs"}
    assert all(len(v) == 2 and all(ms > 0 for ms in v) for v in latencies.values())


def test_run_scale_reports_load_size_and_memory(tmp_path: Path) -> None:
    r = run_scale(tmp_path, SMALL)
    assert r.rows == {"spans": 120_000, "logs": 80_000}
    assert r.load_s > 0 and r.store_mib > 1 and r.peak_rss_mib > 50
    assert r.p("trace (any age)", 95) >= r.p("trace (any age)", 50) > 0

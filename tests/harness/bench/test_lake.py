"""`aiops bench lake` on a tiny lake: every part runs and reports what it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiops_harness.bench.lake import LakeBenchConfig, run_lake
from tests.lake import require_lake

pytestmark = pytest.mark.lake


def test_a_tiny_lake_bench_reports_ingest_queries_bytes_and_upkeep(tmp_path: Path) -> None:
    require_lake()
    cfg = LakeBenchConfig(rows=400_000, ingest_rows=100_000, batch_rows=20_000,
                          commit_interval_s=0.5, small_commits=12, repetitions=2, hours=0.5)
    r = run_lake(tmp_path, cfg)
    assert set(r.ingest) == {"one store, no lake", "one store, lake", "two stores, lake"}
    assert all(rate > 0 for rate in r.ingest.values())
    assert r.lake_rows == 400_000  # every row the fill wrote, read back through the lake
    assert 0 < r.parquet_bytes / r.lake_rows < 200
    assert set(r.latencies_ms) >= {"detect", "evidence", "dashboard", "logs"}
    assert any("model-0" in f for f in r.found)  # the slowed canary, found in the lake
    assert r.files_after < r.files_before
    assert not list(tmp_path.glob("lake-*"))  # its work folder is gone

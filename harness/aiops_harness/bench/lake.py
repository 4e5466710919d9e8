"""``aiops bench lake``: telemetry in DuckLake, on a throwaway PostgreSQL catalog and Parquet
files under the work folder.

- ingest: stores writing as the server does (1M-row batches is ``aiops bench scale``'s; here
  ``batch_rows``), committing to the lake every ``commit_interval_s`` (aiops.lake_sync), timed
  until the lake holds every row: one store alone, then two side by side (separate processes,
  each pinned to its own core), beside one store without a lake;
- queries: ``aiops bench scale``'s correlation and dashboard queries over ``rows`` spans + logs
  in the lake (read by a store whose ``spans`` and ``logs`` are the lake's tables, as
  ``<table>_all`` reads them), bytes per row of the Parquet files;
- upkeep: the time of one upkeep (merging files, expiring snapshots) after many small
  commits, and the files before and after.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queues
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from prometheus_client import CollectorRegistry

from aiops.lake import CATALOG, LakeOptions
from aiops.lake_sync import LakeSync
from aiops.pgcluster import PostgresCluster
from aiops.store import Store
from aiops_harness.bench.common import percentile
from aiops_harness.bench.scale import NS, ScaleConfig, _logs_batch, _spans_batch, run_queries

__all__ = ["LakeBenchConfig", "LakeBenchResult", "run_lake"]


@dataclass(frozen=True)
class LakeBenchConfig:
    rows: int = 100_000_000  # spans + logs in the lake for the queries
    ingest_rows: int = 3_000_000  # per store, in the ingest runs
    batch_rows: int = 100_000
    commit_interval_s: float = 5.0
    small_commits: int = 300  # for the upkeep's cost
    hours: float = 24.0
    repetitions: int = 20
    seed: int = 7


@dataclass
class LakeBenchResult:
    config: LakeBenchConfig
    ingest: dict[str, float] = field(default_factory=dict)  # run -> rows/s into the lake
    lake_rows: int = 0
    fill_s: float = 0.0
    parquet_bytes: int = 0
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)
    upkeep_s: float = 0.0
    files_before: int = 0
    files_after: int = 0

    def p(self, query: str, q: float) -> float:
        return percentile(self.latencies_ms[query], q)


def _batches(cfg: LakeBenchConfig, n: int, now_ns: int) -> list[dict[str, pa.Table]]:
    """``n`` batches of spans and logs (half each), made before anything is timed."""
    rng = np.random.default_rng(cfg.seed)
    scale = ScaleConfig()
    out = []
    width = 60 * NS
    for k in range(n):
        t0 = now_ns - (n - k) * width
        spans, ids = _spans_batch(scale, rng, t0, t0 + width, cfg.batch_rows // 4, now_ns)
        out.append({"spans": spans, "logs": _logs_batch(scale, rng, t0, t0 + width,
                                                        cfg.batch_rows // 2, ids)})
    return out


def _ingest(lake: LakeOptions | None, folder: str, rows: int, cfg: LakeBenchConfig,
            core: int | None, out: Any) -> None:
    """One store's ingest (in its own process): rows/s until the lake holds them all."""
    if core is not None and core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})
    batches = _batches(cfg, 10, time.time_ns())
    store = Store(Path(folder) / "telemetry.duckdb", lake=lake)
    sync = LakeSync(store, cfg.commit_interval_s, 0, CollectorRegistry()) \
        if lake is not None else None
    written = 0
    started = time.perf_counter()
    if sync is not None:
        sync.start()
    while written < rows:
        written += store.append_many(batches[(written // cfg.batch_rows) % len(batches)])
    if sync is not None:
        sync.close()  # the last commit: the lake holds every row
    out.put(written / (time.perf_counter() - started))
    store.close()


def _ingest_runs(pg: PostgresCluster, work: Path, cfg: LakeBenchConfig,
                 progress: Callable[[str], None]) -> dict[str, float]:
    ctx = mp.get_context("spawn")  # DuckDB's threads do not survive fork
    results: dict[str, float] = {}
    runs: dict[str, list[tuple[str, int]]] = {
        "one store, no lake": [],
        "one store, lake": [("a", 0)],
        "two stores, lake": [("a", 0), ("b", 1)],
    }
    for name, stores in runs.items():
        dsn = pg.create_database(f"ingest_{len(results)}")
        data = work / f"ingest-{len(results)}"
        queue = ctx.Queue()
        procs = [ctx.Process(target=_ingest, args=(
            LakeOptions(dsn, data / "lake", sid) if sid else None, str(data / (sid or "plain")),
            cfg.ingest_rows, cfg, core, queue)) for sid, core in (stores or [("", 0)])]
        for p in procs:
            p.start()
        try:
            rates = [_result(queue, procs) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=120)
                if p.is_alive():
                    p.kill()
        results[name] = float(sum(rates))
        progress(f"ingest, {name}: {results[name]:,.0f} rows/s")
        shutil.rmtree(data, ignore_errors=True)
    return results


def _result(queue: Any, procs: list[Any]) -> float:
    """The next store's rate; an error where one of them died without one."""
    while True:
        try:
            return float(queue.get(timeout=2))
        except queues.Empty as exc:  # is everyone still working?
            if any(p.exitcode for p in procs):
                raise RuntimeError("an ingest process failed (its traceback is above)") from exc


def _fill(store: Store, cfg: LakeBenchConfig, now_ns: int, progress: Callable[[str], None]
          ) -> list[str]:
    """``cfg.rows`` spans + logs into the lake, ``aiops bench scale``'s rows (a canary slowed
    in the last two minutes, so detection has something to find); the local window is
    emptied after each commit, as a short retention would."""
    scale = ScaleConfig(spans=cfg.rows // 2, logs=cfg.rows // 2, hours=cfg.hours)
    rng = np.random.default_rng(cfg.seed)
    per = min(2_000_000, cfg.rows)
    batches = max(1, -(-cfg.rows // per))
    edges = np.linspace(now_ns - int(cfg.hours * 3600 * NS), now_ns, batches + 1).astype(np.int64)
    sample: list[str] = []
    for k in range(batches):
        spans, ids = _spans_batch(scale, rng, int(edges[k]), int(edges[k + 1]), per // 4,
                                  now_ns)
        logs = _logs_batch(scale, rng, int(edges[k]), int(edges[k + 1]), per // 2, ids)
        store.append_many({"spans": spans, "logs": logs})
        store.commit_lake()
        for name in ("spans", "logs"):
            store.archive(name, now_ns + 1)
        sample += ids.slice(0, 50).to_pylist()
        if k % 5 == 4 or k == batches - 1:
            progress(f"lake: {(k + 1) * per:,} of {batches * per:,} rows")
    return sample


def _reader(options: LakeOptions) -> Store:
    """A store whose ``spans`` and ``logs`` are the lake's: the scale queries, unchanged, read
    the lake."""
    reader = Store(None, lake=options)
    with reader._cursor() as cur:
        for name in ("spans", "logs"):
            cur.execute(f"DROP TABLE {name}")
            cur.execute(f"CREATE VIEW {name} AS SELECT * EXCLUDE (server_id) "
                        f"FROM {CATALOG}.{name}")
    return reader


def _upkeep(pg: PostgresCluster, work: Path, cfg: LakeBenchConfig) -> tuple[float, int, int]:
    data = work / "upkeep"
    store = Store(data / "telemetry.duckdb",
                  lake=LakeOptions(pg.create_database("upkeep"), data / "lake", "a"))
    batch = _batches(LakeBenchConfig(batch_rows=1000, seed=cfg.seed), 1, time.time_ns())[0]
    for _ in range(cfg.small_commits):
        store.append_many(batch)
        store.commit_lake()

    def files() -> int:
        return sum(1 for _ in (data / "lake").rglob("*.parquet"))

    before = files()
    t = time.perf_counter()
    store.lake_upkeep()
    took = time.perf_counter() - t
    after = files()
    store.close()
    shutil.rmtree(data, ignore_errors=True)
    return took, before, after


def run_lake(workdir: Path, cfg: LakeBenchConfig,
             progress: Callable[[str], None] = lambda _: None) -> LakeBenchResult:
    workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lake-", dir=workdir))
    result = LakeBenchResult(cfg)
    pg_folder = Path(tempfile.mkdtemp(prefix="aiops-bench-pg-"))
    try:
        with PostgresCluster(pg_folder) as pg:
            result.ingest = _ingest_runs(pg, work, cfg, progress)
            result.upkeep_s, result.files_before, result.files_after = _upkeep(pg, work, cfg)
            progress(f"upkeep after {cfg.small_commits} small commits: "
                     f"{result.upkeep_s:.2f} s, files {result.files_before} -> "
                     f"{result.files_after}")
            options = LakeOptions(pg.create_database("queries"), work / "lake", "writer")
            now_ns = time.time_ns()
            writer = Store(work / "writer" / "telemetry.duckdb", lake=options)
            t = time.perf_counter()
            sample = _fill(writer, cfg, now_ns, progress)
            result.fill_s = time.perf_counter() - t
            writer.close()
            result.parquet_bytes = sum(p.stat().st_size for p in
                                       (work / "lake").rglob("*.parquet"))
            reader = _reader(LakeOptions(options.catalog, options.data_path, "reader"))
            try:
                result.lake_rows = sum(int(reader.query(f"SELECT count(*) FROM {n}").rows[0][0])
                                       for n in ("spans", "logs"))
                progress("timing the queries")
                result.latencies_ms, result.found = run_queries(reader, now_ns, sample,
                                                                cfg.repetitions, cfg.seed)
            finally:
                reader.close()
    finally:
        shutil.rmtree(pg_folder, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return result

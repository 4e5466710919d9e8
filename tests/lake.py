"""A real PostgreSQL (Debian's binaries, a throwaway cluster on loopback) as the lake's
catalog, for the tests of the lake."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from aiops.lake import LakeOptions, lake_unavailable
from aiops.pgcluster import PostgresCluster
from aiops.store import Store

_names = itertools.count()


def require_lake() -> None:
    """Skip where this environment's DuckDB cannot load the lake's extensions; `make test`
    runs the lake tests with the lake's DuckDB and AIOPS_REQUIRE_LAKE=1, where that fails."""
    why = lake_unavailable()
    if why is not None:
        if os.environ.get("AIOPS_REQUIRE_LAKE") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresCluster]:
    require_lake()
    # Under /tmp itself: the `postgres` user (root's tests run it as that) must reach it.
    folder = Path(tempfile.mkdtemp(prefix="aiops-pg-"))
    cluster = PostgresCluster(folder).start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


LakeOf = Callable[[str], LakeOptions]


@pytest.fixture
def lake_of(pg: PostgresCluster, tmp_path: Path) -> LakeOf:
    """A new lake (its own catalog database and data folder); called with a server id, that
    server's options for it."""
    dsn = pg.create_database(f"lake_{next(_names)}_{int(time.time())}")
    return lambda server_id: LakeOptions(dsn, tmp_path / "lake-data", server_id,
                                         commit_interval_s=0.5, upkeep_interval_s=0)


@pytest.fixture
def two(tmp_path: Path, lake_of: LakeOf) -> Iterator[tuple[Store, Store]]:
    """Two servers' stores ("a" and "b") on one new lake."""
    a = Store(tmp_path / "a" / "telemetry.duckdb", lake=lake_of("a"))
    b = Store(tmp_path / "b" / "telemetry.duckdb", lake=lake_of("b"))
    yield a, b
    a.close()
    b.close()


def logs(n: int, server: str, start: int = 0) -> pa.Table:
    """``n`` log records of ``server`` with bodies numbered from ``start`` (each unique)."""
    now = time.time_ns()
    return pa.Table.from_pylist([{"time": now + i, "body": f"{server} {start + i}",
                                  "service_name": server} for i in range(n)])

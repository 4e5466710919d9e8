"""`aiops bench phoenix --storage postgresql`: the peer's production storage is a real
PostgreSQL whose span count the bench reads (Phoenix itself runs only in `make bench`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from aiops.pgcluster import USER
from aiops_harness.bench.phoenix import _storage


def test_phoenix_gets_a_postgresql_url_and_its_spans_are_counted_there(tmp_path: Path) -> None:
    with _storage("postgresql", tmp_path) as (env, stored):
        url = env["PHOENIX_SQL_DATABASE_URL"]
        assert url.startswith(f"postgresql://{USER}@127.0.0.1:") and url.endswith("/phoenix")
        assert stored() == 0  # no spans table yet: nothing stored
        port = url.rsplit(":", 1)[1].split("/")[0]
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", port, "-U", USER, "-d", "phoenix",
                        "-c", "CREATE TABLE spans (id int); INSERT INTO spans VALUES (1), (2)"],
                       check=True, capture_output=True)
        assert stored() == 2


def test_sqlite_storage_counts_phoenixs_own_file(tmp_path: Path) -> None:
    with _storage("sqlite", tmp_path) as (env, stored):
        assert env == {} and stored() == 0

"""``aiops bench phoenix``: span ingest beside Arize Phoenix's OTLP receiver.

Both servers get the same pre-encoded OTLP/HTTP protobuf trace requests in the same run, each
on core 0 with the clients on the other core. A span counts once it is stored: for aiops when
its request's 200 arrives (the server answers after its group commit in DuckDB); Phoenix
answers first and inserts in the background, so its figure is taken when its database holds
every span (polled), with the time its HTTP answers took beside it. Phoenix runs from its own
virtualenv (``--venv``; its pins conflict with this project's), with its default SQLite
storage in a temporary working directory, or (``storage="postgresql"``, its production
setup) on a throwaway PostgreSQL on loopback, on the other core.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from aiops.pgcluster import USER, PostgresCluster
from aiops_harness.bench.common import free_port, peak_rss_mib, running_server
from aiops_harness.bench.ingest import _replay, encoded_trace_requests

__all__ = ["PhoenixResult", "run_phoenix"]


@dataclass(frozen=True)
class Side:
    spans: int
    accepted_s: float  # until the last request's answer
    stored_s: float  # until every span is stored
    peak_rss_mib: float

    @property
    def stored_per_s(self) -> float:
        return self.spans / self.stored_s


@dataclass(frozen=True)
class PhoenixResult:
    aiops: Side
    phoenix: Side
    phoenix_version: str
    storage: str = "sqlite"  # Phoenix's

    @property
    def ratio(self) -> float:
        """aiops' stored spans/s over Phoenix's."""
        return self.aiops.stored_per_s / self.phoenix.stored_per_s


def _phoenix_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('arize-phoenix'))"],
                         capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"arize-phoenix is not installed in {venv}: {out.stderr.strip()}")
    return out.stdout.strip()


def _stored(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM spans").fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet, or busy: poll again


Storage = Literal["sqlite", "postgresql"]


@contextlib.contextmanager
def _storage(kind: Storage, workdir: Path) -> Iterator[tuple[dict[str, str], Callable[[], int]]]:
    """Phoenix's environment for its storage, and how many spans that storage holds."""
    if kind == "sqlite":
        yield {}, lambda: _stored(workdir / "phoenix.db")
        return
    folder = Path(tempfile.mkdtemp(prefix="aiops-bench-phoenix-pg-"))
    previous = os.sched_getaffinity(0)
    if (os.cpu_count() or 1) > 1:
        # Off Phoenix's core, as a database server would be: on the clients' core, which
        # is idle after the first second (the requests are sent in a burst).
        os.sched_setaffinity(0, previous - {0} or previous)
    try:
        cluster = PostgresCluster(folder).start()
    finally:
        os.sched_setaffinity(0, previous)
    try:
        cluster.create_database("phoenix")

        def stored() -> int:
            out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(cluster.port), "-U",
                                  USER, "-d", "phoenix", "-tAc", "SELECT count(*) FROM spans"],
                                 capture_output=True, text=True, timeout=60, check=False)
            return int(out.stdout.strip()) if out.returncode == 0 else 0  # no table yet

        yield {"PHOENIX_SQL_DATABASE_URL":
               f"postgresql://{USER}@127.0.0.1:{cluster.port}/phoenix"}, stored
    finally:
        cluster.stop("immediate")
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def _run_phoenix(venv: Path, bodies: list[bytes], spans: int, clients: int, workdir: Path,
                 timeout_s: float, storage: Storage = "sqlite") -> Side:
    with _storage(storage, workdir) as (database, count):
        return _serve_phoenix(venv, bodies, spans, clients, workdir, timeout_s, database,
                              count)


def _serve_phoenix(venv: Path, bodies: list[bytes], spans: int, clients: int, workdir: Path,
                   timeout_s: float, database: dict[str, str], count: Callable[[], int]
                   ) -> Side:
    port = free_port()
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port()),
           "PHOENIX_HOST": "127.0.0.1", "PHOENIX_WORKING_DIR": str(workdir),
           "PHOENIX_TELEMETRY_ENABLED": "false", **database}
    cmd = [str(venv / "bin" / "phoenix"), "serve"]
    if (os.cpu_count() or 1) > 1:
        cmd = ["taskset", "-c", "0", *cmd]
    log = (workdir / "phoenix.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                tail = (workdir / "phoenix.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"phoenix exited ({proc.returncode}):\n{tail}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("phoenix did not answer /healthz within 180 s")
            time.sleep(0.5)
        started = time.perf_counter()
        accepted = _replay(url, "traces", bodies, 1, clients)
        while count() < spans:
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"phoenix stored {count()} of {spans} spans in "
                                   f"{timeout_s:g} s")
            time.sleep(0.5)  # seldom: a reader must not be what slows its writer
        stored = time.perf_counter() - started
        return Side(spans, accepted, stored, peak_rss_mib(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _run_aiops(bodies: list[bytes], spans: int, clients: int, workdir: Path) -> Side:
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, previous - {0} or previous)
    try:
        with running_server(workdir, cpu=0) as (settings, pid):
            elapsed = _replay(settings.server_url, "traces", bodies, 1, clients)
            return Side(spans, elapsed, elapsed, peak_rss_mib(pid))
    finally:
        os.sched_setaffinity(0, previous)


def run_phoenix(venv: Path, requests: int = 20, spans_per_request: int = 1000,
                clients: int = 4, timeout_s: float = 1200, storage: Storage = "sqlite"
                ) -> PhoenixResult:
    """The same ``requests`` x ``spans_per_request`` distinct spans into each server."""
    version = _phoenix_version(venv)
    bodies = encoded_trace_requests(requests, spans_per_request)
    spans = requests * spans_per_request
    with tempfile.TemporaryDirectory(prefix="aiops-bench-phoenix-") as tmp:
        work = Path(tmp)
        (work / "aiops").mkdir()
        (work / "phoenix").mkdir()
        ours = _run_aiops(bodies, spans, clients, work / "aiops")
        theirs = _run_phoenix(venv, bodies, spans, clients, work / "phoenix", timeout_s,
                              storage)
    return PhoenixResult(ours, theirs, version, storage)

"""``make demo-lake`` (``python -m aiops_harness.demo.lake``): two aiops servers on one DuckLake.

A throwaway PostgreSQL catalog on loopback, two `aiops server` processes with
``storage_backend = ducklake`` and one data folder, spans sent to each; then each server's
``spans_all`` shows both servers' rows. Everything stops at the end (``--keep`` leaves it up).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from aiops.config import Settings, load_settings
from aiops.pgcluster import PostgresCluster
from aiops.stack import settings_env
from aiops_harness.bench.common import free_port

__all__ = ["LakeServer", "lake_settings", "spans"]

PROTOBUF = {"content-type": "application/x-protobuf"}


@dataclass
class LakeServer:
    """An `aiops server` subprocess; what it acknowledged is in ``acked``."""

    settings: Settings
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    acked: list[str] = field(default_factory=list)

    def start(self) -> None:
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "aiops", "server"],
                                         env={**os.environ, **settings_env(self.settings)},
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 180  # a loaded machine: imports take long
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.settings.server_url}/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"the aiops server did not start: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)

    def send(self, client: httpx.Client, n: int = 20) -> bool:
        body, ids = spans(n)
        if client.post(f"{self.settings.server_url}/v1/traces", content=body,
                       headers=PROTOBUF).status_code != 200:
            return False
        self.acked.extend(ids)
        return True

    def sql(self, sql: str, params: list[object] | None = None) -> list[list[object]]:
        r = httpx.post(f"{self.settings.server_url}/api/v1/sql",
                       json={"sql": sql, "params": params or []}, timeout=60)
        r.raise_for_status()
        return list(r.json()["rows"])


def lake_settings(data_dir: Path, server_id: str, catalog: str, data_path: Path,
                  **overrides: Any) -> Settings:
    return load_settings(**{
        "data_dir": data_dir, "server_port": free_port(), "otlp_grpc_port": 0,
        "log_level": "WARNING", "scrape_targets": "", "analytics": False,
        "storage_backend": "ducklake", "lake_catalog": catalog, "lake_data_path": data_path,
        "server_id": server_id, **overrides})


def spans(n: int) -> tuple[bytes, list[str]]:
    """An OTLP/protobuf request of ``n`` spans with fresh ids, and their span ids (hex)."""
    now = time.time_ns()
    ids = [secrets.token_bytes(8) for _ in range(n)]
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
        spans=[Span(trace_id=secrets.token_bytes(16), span_id=i, name="op",
                    start_time_unix_nano=now, end_time_unix_nano=now + 1000) for i in ids])])])
    return req.SerializeToString(), [i.hex() for i in ids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo-lake", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path(".aiops/demo-lake"))
    parser.add_argument("--keep", action="store_true", help="leave the servers and "
                        "PostgreSQL running (stop them with Ctrl-C)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    # Under /tmp: as root, PostgreSQL runs as the `postgres` user, who must reach its folder.
    pg_folder = Path(tempfile.mkdtemp(prefix="aiops-lake-pg-"))
    with PostgresCluster(pg_folder) as pg:
        catalog = pg.create_database("aiops_lake")
        print(f"PostgreSQL catalog: {catalog}")
        servers = [LakeServer(lake_settings(args.workdir / name, name, catalog,
                                            args.workdir / "lake-data",
                                            lake_commit_interval_s=2.0),
                              args.workdir / f"{name}.log") for name in ("cluster-a", "cluster-b")]
        try:
            for s in servers:
                s.start()
                print(f"aiops server {s.settings.server_id}: {s.settings.server_url}")
            with httpx.Client(timeout=10) as client:
                for i, s in enumerate(servers):
                    for _ in range(10 * (i + 1)):
                        s.send(client, 100)
            print(f"sent {len(servers[0].acked)} spans to cluster-a, {len(servers[1].acked)} "
                  "to cluster-b; waiting for their commits to the lake")
            time.sleep(5)
            query = "SELECT server_id, count(*) AS spans FROM spans_all GROUP BY 1 ORDER BY 1"
            for s in servers:
                print(f"{s.settings.server_id}: {query}")
                for row in s.sql(query):
                    print(f"    {row[0]:<12} {row[1]:>8,}")
            if args.keep:
                print("running; Ctrl-C stops the servers and PostgreSQL")
                signal.pause()
        finally:
            for s in servers:
                s.stop()
    shutil.rmtree(pg_folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

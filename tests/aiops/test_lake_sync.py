"""Two real `aiops server` processes on one lake (a real PostgreSQL catalog): what each
acknowledged is in the lake once, after a kill -9 of one of them mid-ingest and after the
catalog's restart under load, and each server says when the lake is down and back."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from aiops.pgcluster import PostgresCluster
from aiops_harness.demo.lake import LakeServer, lake_settings
from tests.lake import LakeOf, lake_of, pg

__all__ = ["lake_of", "pg"]  # fixtures

pytestmark = pytest.mark.lake


class Sender:
    """Sends spans to a server until stopped, remembering what it acknowledged."""

    def __init__(self, server: LakeServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as c:
            while not self.stop.is_set():
                try:
                    self.server.send(c)
                except httpx.HTTPError:
                    time.sleep(0.05)  # killed or restarting: what it did not ack is resent

    def join(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.fixture
def servers(tmp_path: Path, lake_of: LakeOf) -> Iterator[dict[str, LakeServer]]:
    made = {}
    for name in "ab":
        lake = lake_of(name)
        made[name] = LakeServer(lake_settings(tmp_path / name, name, lake.catalog,
                                              lake.data_path, lake_commit_interval_s=0.5),
                                tmp_path / f"{name}.log")
    for s in made.values():
        s.start()
    yield made
    for s in made.values():
        s.stop(signal.SIGKILL)


def acks(server: LakeServer, more: int, timeout_s: float = 120) -> None:
    """Wait until ``server`` has acknowledged ``more`` spans beyond what it had (no fixed
    sleeps: the lane may run at idle priority beside others)."""
    target = len(server.acked) + more
    deadline = time.monotonic() + timeout_s
    while len(server.acked) < target:
        assert time.monotonic() < deadline, f"{server.settings.server_id} stopped acknowledging"
        time.sleep(0.05)


def lake_holds(reader: LakeServer, writer: LakeServer, timeout_s: float = 60) -> None:
    """Every span ``writer`` acknowledged is in the lake as ``reader`` reads it, once each."""
    deadline = time.monotonic() + timeout_s
    while True:
        [[found, rows, distinct]] = reader.sql(
            "SELECT count(DISTINCT span_id) FILTER (WHERE list_contains(?, span_id)), count(*), "
            "count(DISTINCT span_id) FROM spans_all WHERE server_id = ?",
            [writer.acked, writer.settings.server_id])
        if found == len(writer.acked) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert found == len(writer.acked) > 0
    assert rows == distinct  # no row twice


def test_what_a_killed_server_acknowledged_reaches_the_lake_after_its_restart(
        servers: dict[str, LakeServer]) -> None:
    a, b = servers["a"], servers["b"]
    senders = [Sender(a), Sender(b)]
    acks(a, 2000)
    acks(b, 2000)
    a.stop(signal.SIGKILL)  # mid-ingest, with rows acknowledged and not yet in the lake
    senders[0].join()
    a.start()
    senders[0] = Sender(a)
    acks(a, 1000)
    for s in senders:
        s.join()
    lake_holds(b, a)  # b reads a's rows from the lake alone
    lake_holds(a, b)
    lake_holds(a, a)


def test_a_catalog_restart_under_load_loses_nothing_and_is_logged(
        servers: dict[str, LakeServer], pg: PostgresCluster) -> None:
    a, b = servers["a"], servers["b"]
    senders = [Sender(a), Sender(b)]
    acks(a, 1000)
    pg.stop()
    try:
        down = time.monotonic()
        acks(a, 2000)  # ingest goes on: acknowledged while the catalog is down
        acks(b, 2000)
        while "lake unreachable" not in a.log.read_text():  # commits fail and retry
            assert time.monotonic() - down < 120
            time.sleep(0.1)
    finally:
        pg.start()
    acks(a, 1000)
    for s in senders:
        s.join()
    lake_holds(b, a)
    lake_holds(a, b)
    log = a.log.read_text()
    assert "lake unreachable" in log and "rows wait in the local store" in log
    assert "the lake is reachable again" in log

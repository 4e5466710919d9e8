"""A server that watches serving it did not start does not expect the stack `aiops up`
starts: no scrape of the local Ray metrics port (its default target) and no calls to that
stack's control plane; a plain server (or one `aiops up` started) still does both."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aiops.config import AttachTarget, Settings, load_settings
from aiops.server.app import _embedded, create_app
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.loopback import serving


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                         ray_metrics_port=free_port(), scrape_targets="ray",
                         scrape_interval_s=0.2, analytics=False, **overrides)


def _scraped_jobs(settings: Settings) -> set[str]:
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port):
            time.sleep(1.5)
        return {r[0] for r in store.query(
            "SELECT DISTINCT service_name FROM metric_points WHERE name = 'up'").rows}
    finally:
        store.close()


def test_a_plain_server_scrapes_the_local_ray_port(tmp_path: Path) -> None:
    assert _scraped_jobs(_settings(tmp_path)) == {"ray"}


def test_an_attach_only_server_does_not(tmp_path: Path) -> None:
    vllm = AttachTarget(kind="vllm", name="chat-vllm", url=f"http://127.0.0.1:{free_port()}")
    # Only the attached vLLM server is scraped (down here: its `up` is 0).
    assert _scraped_jobs(_settings(tmp_path, attach=(vllm,))) == {"chat-vllm"}


@pytest.mark.parametrize(("mode", "attached", "expected"), [
    ("auto", False, True), ("auto", True, False), ("on", True, True), ("off", False, False)])
def test_whether_the_embedded_stack_is_expected(tmp_path: Path, mode: str, attached: bool,
                                                expected: bool) -> None:
    targets = (AttachTarget(kind="ray", name="r", url="http://127.0.0.1:1"),) if attached \
        else ()
    settings = load_settings(data_dir=tmp_path, embedded_stack=mode, attach=targets)
    assert _embedded(settings) is expected

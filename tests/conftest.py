"""Shared fixtures: real DuckDB files in temp dirs and a real uvicorn server on loopback."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aiops.cli import app as cli_app
from aiops.config import Settings, load_settings
from aiops.server.app import create_app
from aiops.stack import read_state, session_members, settings_env
from aiops.store import Store
from aiops_harness.bench.common import free_port
from tests.loopback import serving

# Servers started by tests (and their child processes) leave OTLP/gRPC off unless a test asks
# for it on a port of its own: several run at once in the stack lane, and 4317 is one port.
os.environ.setdefault("AIOPS_OTLP_GRPC_PORT", "0")


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """A CLI command run in-process (`aiops server` configures JSON logging) must not leave
    the root logger writing to its finished CliRunner's closed stream for later tests."""
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(data_dir=tmp_path / "data", server_port=free_port(),
                         serve_port=free_port(), control_port=free_port(), scrape_targets="")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()


@dataclass
class RunningServer:
    url: str
    store: Store
    settings: Settings


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    """The aiops server app in a real uvicorn on a loopback port, in a thread."""
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store), settings.server_port, settings):
            yield RunningServer(settings.server_url, store, settings)
    finally:
        store.close()


TEST_MODELS = Path(__file__).with_name("models-test.yaml")


@contextmanager
def running_stack(data_dir: Path, models_file: Path, **overrides: Any) -> Iterator[Settings]:
    """A real stack on free ports, started and stopped through the CLI (`aiops up`/`down`);
    on the way out, nothing it started may be left running."""
    s = Settings(data_dir=data_dir, server_port=free_port(), serve_port=free_port(),
                 control_port=free_port(), ray_metrics_port=free_port(),
                 models_file=models_file, **overrides)
    env = settings_env(s)
    result = CliRunner().invoke(cli_app, ["up"], env=env)
    assert result.exit_code == 0, result.output
    components = read_state(s)
    yield s
    result = CliRunner().invoke(cli_app, ["down"], env=env)
    assert result.exit_code == 0, result.output
    leftovers = [pid for c in components for pid in session_members(c.pid)]
    assert leftovers == [], f"processes left running after down: {leftovers}"
    assert not (data_dir / "stack.json").exists()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """One real stack for the whole session: aiops server + local Ray + Serve with the
    models of tests/models-test.yaml."""
    # The test stack is the small one: no `aiops-agent` replica, the agent uses the chat model.
    with running_stack(tmp_path_factory.mktemp("stack"), TEST_MODELS,
                       scrape_interval_s=2, ebpf_interval_s=1,
                       agent_llm_model="smollm2-135m-instruct") as s:
        yield s


# The dataset evaluations (tests/harness/evals, tests/harness/agent_evals) are offline work: CPU
# on datasets, no servers, no timing. Marked `offline` here, which `make test` runs at idle
# priority beside the stack lane.
EVAL_DIRS = (Path(__file__).parent / "harness" / "evals",
             Path(__file__).parent / "harness" / "agent_evals")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(d in item.path.parents for d in EVAL_DIRS):
            item.add_marker(pytest.mark.offline)

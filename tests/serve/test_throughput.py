"""Ray Serve's high-throughput mode (serve.throughput): what `serve_proxy = haproxy` sets
before Ray starts, and what it leaves behind (nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from aiops.config import Settings
from serve.throughput import MAX_STATE_DIR, environment, high_throughput_env, http_front


def test_the_mode_turns_on_haproxy_and_grpc_with_its_files_in_one_directory() -> None:
    env = high_throughput_env(Path("/tmp/hap-x"), 23456)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert env["RAY_SERVE_HAPROXY_METRICS_PORT"] == "23456"
    paths = [v for k, v in env.items() if k.endswith(("_LOC", "_PATH", "_BASE", "_FILE"))]
    assert len(paths) == 4 and all(p.startswith("/tmp/hap-x") for p in paths)


def test_a_directory_too_long_for_haproxys_socket_is_refused() -> None:
    # Ray puts the socket one directory (a 56-character hash) below; HAProxy takes 97 bytes.
    assert len("/tmp/hap-abcdefgh") <= MAX_STATE_DIR
    with pytest.raises(ValueError, match="too long"):
        high_throughput_env(Path("/tmp/" + "d" * MAX_STATE_DIR), 1)


def test_the_environment_is_restored_after_the_block() -> None:
    os.environ["AIOPS_TEST_KEPT"] = "before"
    os.environ.pop("AIOPS_TEST_ADDED", None)
    try:
        with environment({"AIOPS_TEST_KEPT": "during", "AIOPS_TEST_ADDED": "1"}):
            assert os.environ["AIOPS_TEST_KEPT"] == "during"
            assert os.environ["AIOPS_TEST_ADDED"] == "1"
        assert os.environ["AIOPS_TEST_KEPT"] == "before"
        assert "AIOPS_TEST_ADDED" not in os.environ
    finally:
        os.environ.pop("AIOPS_TEST_KEPT", None)


def test_haproxy_in_front_gets_a_private_short_directory_removed_afterwards() -> None:
    with http_front("haproxy"):
        state = Path(os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"])
        assert state.is_dir() and len(str(state)) <= MAX_STATE_DIR
        assert state.stat().st_mode & 0o077 == 0  # nobody else may plant files there
    assert not state.exists()
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    with http_front("serve"):
        assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ


def test_haproxy_runs_on_one_node_only(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path, serve_proxy="haproxy").serve_proxy == "haproxy"
    with pytest.raises(ValidationError, match="one node"):
        Settings(data_dir=tmp_path, serve_proxy="haproxy", ray_worker_nodes=1)
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, serve_proxy="nginx")

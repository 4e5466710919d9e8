"""Stack bookkeeping without starting anything heavy: state, sessions, stale pids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiops import stack
from aiops.config import Settings
from aiops.errors import StackError


def write_stat(proc: Path, pid: int, comm: str, session: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    # pid (comm) state ppid pgrp session ...
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {session} 0 -1 0\n")


def test_session_members_reads_the_session_column(tmp_path: Path) -> None:
    write_stat(tmp_path, 100, "python3", 100)
    write_stat(tmp_path, 101, "ray::Serve Replica", 100)  # spaces and ')' in comm are fine
    write_stat(tmp_path, 102, "weird) name", 100)
    write_stat(tmp_path, 200, "bash", 200)
    assert sorted(stack.session_members(100, proc=tmp_path)) == [100, 101, 102]


def test_down_without_a_stack_stops_nothing(settings: Settings) -> None:
    assert stack.down(settings) == 0
    assert stack.status(settings) == []


def test_a_stale_state_file_does_not_block_up_bookkeeping(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (settings.data_dir / stack.STATE_FILE).write_text(json.dumps(
        {"components": [{"name": "server", "pid": dead.pid, "log_file": "x"}]}))
    assert stack.status(settings)[0]["running"] is False
    assert stack.down(settings) == 0
    assert not (settings.data_dir / stack.STATE_FILE).exists()


def test_down_stops_a_whole_session(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True)
    # A leader that starts a child in its own process group, as Ray does with its actors.
    leader = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
         " process_group=0)\n"
         "time.sleep(600)"],
        start_new_session=True)
    try:
        import time
        deadline = time.monotonic() + 10
        while len(stack.session_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = stack.session_members(leader.pid)
        assert len(members) == 2
        (settings.data_dir / stack.STATE_FILE).write_text(json.dumps(
            {"components": [{"name": "serve", "pid": leader.pid, "log_file": "x"}]}))
        assert stack.down(settings) == 1
        assert stack.session_members(leader.pid) == []
    finally:
        leader.kill()
        leader.wait()


def test_an_unreadable_state_file_is_reported(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True)
    (settings.data_dir / stack.STATE_FILE).write_text("{broken")
    with pytest.raises(StackError, match="unreadable"):
        stack.down(settings)

"""``aiops up`` / ``aiops down`` / ``aiops status``: the embedded stack on one machine.

Two child processes, each in its own session so that its whole process tree can be signalled:
the aiops server (owner of the DuckDB file) and the Serve driver (its own local Ray instance).
Their pids are kept in ``<data_dir>/stack.json``; ``down`` stops exactly those process groups.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from aiops.config import ENV_PREFIX, Settings
from aiops.errors import StackError
from aiops.fileperms import private_dir
from aiops.tls import client_verify

# Written by the Serve driver (serve.runner) once its application runs; only the name is shared.
READY_FILE = "serve.ready"

__all__ = ["Component", "down", "read_state", "session_members", "settings_env", "status", "up"]

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class Component:
    name: str
    pid: int
    log_file: str


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as ``AIOPS_*`` variables, so child processes read the very same config."""
    env = {}
    dumped = settings.model_dump(mode="json")
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, Path):
            value = value.resolve()
        elif isinstance(value, tuple | list | dict):
            value = json.dumps(dumped[name])  # pydantic-settings reads these as JSON
        env[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return env


def _state_path(settings: Settings) -> Path:
    return settings.data_dir / STATE_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still "exists"; reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def read_state(settings: Settings) -> list[Component]:
    path = _state_path(settings)
    if not path.exists():
        return []
    try:
        return [Component(**c) for c in json.loads(path.read_text())["components"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise StackError(f"state file {path} is unreadable ({exc}); remove it by hand") from exc


def _write_state(settings: Settings, components: list[Component]) -> None:
    _state_path(settings).write_text(
        json.dumps({"components": [asdict(c) for c in components]}, indent=2))


def _spawn(name: str, argv: list[str], settings: Settings) -> Component:
    logs = settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{name}.log"
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
    if settings.embedded_stack == "auto":  # this server serves the stack started beside it
        env["AIOPS_EMBEDDED_STACK"] = "on"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Component(name, proc.pid, str(log_file))


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _answers(url: str, verify: ssl.SSLContext | bool = True) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2.0, verify=verify).status_code == 200
    return False


def _wait_ready(c: Component, ready: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(c.pid):
            raise StackError(f"{c.name} exited during start-up; last log lines of "
                             f"{c.log_file}:\n{_tail(c.log_file)}")
        if ready():
            return
        time.sleep(0.5)
    raise StackError(f"{c.name} was not ready ({what}) after {timeout_s:.0f} s; "
                     f"see {c.log_file}")


def up(settings: Settings, progress: Callable[[str], None] = lambda _: None) -> list[Component]:
    """Start the server and the Serve application; return once both answer."""
    running = [c for c in read_state(settings) if _alive(c.pid)]
    if running:
        raise StackError(f"the stack is already running from {settings.data_dir} "
                         f"({', '.join(c.name for c in running)}); run `aiops down` first")
    # Fail on a bad model spec file now, with its message, not in a child's log.
    from serve.specs import DEFAULT_SPECS_FILE, load_specs

    load_specs(settings.models_file or DEFAULT_SPECS_FILE)
    private_dir(settings.data_dir)  # 0700 when made here (aiops.fileperms)
    started: list[Component] = []
    try:
        # The server and Ray with the Serve application start side by side: each takes
        # seconds, mostly waiting, and neither needs the other up to start (credentials are
        # made by whichever comes first; exporters retry until the server answers). The eBPF
        # collector comes once the replicas are listed, so that it attributes what it sees
        # from its first interval (and a worker node's collector needs its node).
        progress(f"starting aiops server on {settings.server_url}")
        server = _spawn("server", [sys.executable, "-m", "aiops", "server"], settings)
        started.append(server)
        _write_state(settings, started)
        progress(f"starting Ray and the Serve application on {settings.serve_url}")
        serve_proc = _spawn("serve", [sys.executable, "-m", "serve.runner"], settings)
        started.append(serve_proc)
        _write_state(settings, started)
        url = f"{settings.server_url}/readyz"
        verify = client_verify(settings)
        _wait_ready(server, lambda: _answers(url, verify), url, settings.startup_timeout_s)
        # The driver writes the marker once serve.run returned: every deployment is running.
        marker = settings.data_dir / READY_FILE
        url = f"{settings.serve_url}/healthz"
        _wait_ready(serve_proc, lambda: marker.exists() and _answers(url),
                    f"{marker} and {url}", settings.startup_timeout_s)
        for collector in _start_ebpf(settings, progress):
            started.append(collector)
            _write_state(settings, started)
    except BaseException:
        _stop(started)
        _state_path(settings).unlink(missing_ok=True)
        raise
    progress("stack is up")
    return started


def _start_ebpf(settings: Settings, progress: Callable[[str], None]) -> Iterator[Component]:
    """The eBPF collector, when this machine allows it (``ebpf=auto``) or must (``on``): one
    for the machine, or with worker nodes one per Ray node, as a DaemonSet would run them."""
    if settings.ebpf == "off":
        return
    from collectors.ebpf.collector import preflight, ready_file
    from serve.cluster import read_nodes

    problems = preflight(settings.ebpf_kernel_source)
    if problems:
        if settings.ebpf == "on":
            raise StackError("the eBPF collector cannot start (AIOPS_EBPF=on): "
                             + "; ".join(problems))
        progress("eBPF collector not started: " + "; ".join(problems))
        return
    nodes: list[str | None] = [None]
    if settings.ray_worker_nodes:
        nodes = [n.name for n in read_nodes(settings.data_dir)]
    for node in nodes:
        name = f"ebpf-{node}" if node else "ebpf"
        progress(f"starting the eBPF collector{f' of Ray node {node}' if node else ''}")
        collector = _spawn(name, [sys.executable, "-m", "collectors.ebpf"],
                           settings.model_copy(update={"ebpf_node": node}))
        yield collector
        marker = settings.data_dir / ready_file(node)
        _wait_ready(collector, marker.exists, str(marker), settings.startup_timeout_s)


def _stop(components: list[Component], timeout_s: float = 60.0) -> None:
    # Reverse order: Serve first (it still exports to the server while draining).
    for c in reversed(components):
        if not _alive(c.pid):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(c.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(c.pid):
            log.warning("%s (pid %d) ignored SIGTERM; killing its process group", c.name, c.pid)
        # Whatever the leader left behind in its session goes too: Ray puts its actors in
        # process groups of their own, but they stay in the session the leader created.
        for pid in [c.pid, *session_members(c.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        # SIGKILL is asynchronous: return only once the whole session is gone.
        deadline = time.monotonic() + 10
        while (_alive(c.pid) or session_members(c.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if session_members(c.pid):
            log.error("%s: processes %s survived SIGKILL", c.name, session_members(c.pid))


def session_members(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live pids whose session id is ``sid`` (Linux /proc; ``proc`` is injectable for tests).

    Zombies are left out: they are already dead, waiting for a parent (often init) to reap them.
    """
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # Fields after the parenthesised command: state ppid pgrp session ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def down(settings: Settings, progress: Callable[[str], None] = lambda _: None) -> int:
    """Stop what ``up`` started from this data dir; return how many components were stopped."""
    components = read_state(settings)
    live = [c for c in components if _alive(c.pid)]
    for c in reversed(live):
        progress(f"stopping {c.name} (pid {c.pid})")
    _stop(live)
    _state_path(settings).unlink(missing_ok=True)
    return len(live)


def status(settings: Settings) -> list[dict[str, object]]:
    """One row per component: pid, whether it runs, and whether it is healthy (its endpoint
    answers; for the eBPF collector, which serves nothing, its ready marker is present)."""
    urls = {"server": f"{settings.server_url}/readyz", "serve": f"{settings.serve_url}/healthz"}
    verify = {"server": client_verify(settings), "serve": True}
    rows: list[dict[str, object]] = []
    for c in read_state(settings):
        running = _alive(c.pid)
        # An eBPF collector's marker: ebpf.ready, or ebpf-<node>.ready for a node's own.
        marker = settings.data_dir / f"{c.name}.ready"
        if c.name in urls:
            healthy = running and _answers(urls[c.name], verify[c.name])
        else:
            healthy = running and marker.exists()
        rows.append({"component": c.name, "pid": c.pid, "running": running,
                     "healthy": healthy, "url": urls.get(c.name, str(marker)),
                     "log": c.log_file})
    return rows

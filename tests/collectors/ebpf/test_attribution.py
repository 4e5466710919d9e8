"""Attribution: thread -> process -> Serve replica, from /proc and the driver's replica file."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path

from collectors.ebpf.attribution import Processes, ProcessInfo, _from_title, local_addresses


def test_a_thread_resolves_to_its_process() -> None:
    tids: list[int] = []
    done = threading.Event()
    t = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), done.wait()))
    t.start()
    try:
        while not tids:
            pass
        assert tids[0] != os.getpid()
        assert Processes().tgid_of(tids[0]) == os.getpid()
    finally:
        done.set()
        t.join()


def test_a_gone_thread_resolves_to_nothing() -> None:
    assert Processes().tgid_of(2**22 + 12345) is None


def test_a_listed_replica_carries_its_serve_identity(tmp_path: Path) -> None:
    replicas = tmp_path / "serve-replicas.json"
    replicas.write_text(json.dumps([{"pid": os.getpid(), "app": "smollm2-v2",
                                     "deployment": "smollm2-v2", "replica": "abc123",
                                     "model": "smollm2", "version": "v2"}]))
    procs = Processes(replicas)
    procs.refresh()
    attrs = procs.info(os.getpid()).attributes()
    assert attrs["ray.serve.deployment"] == "smollm2-v2"
    assert attrs["ray.serve.replica"] == "abc123"
    assert attrs["aiops.model.version"] == "v2"
    assert attrs["process.pid"] == os.getpid()
    assert attrs["process.command"] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


def test_an_attached_clusters_replicas_count_only_on_their_own_node(tmp_path: Path) -> None:
    """The server's attach-replicas.json lists every node's replicas; a pid listed for
    another node's address is another process."""
    embedded, attached = tmp_path / "serve-replicas.json", tmp_path / "attach-replicas.json"
    embedded.write_text("[]")
    row = {"pid": os.getpid(), "app": "greeter", "deployment": "Greeter", "replica": "r1",
           "model": "greeter", "version": "1"}
    attached.write_text(json.dumps([{**row, "node_ip": "203.0.113.9"}]))
    procs = Processes([embedded, attached])
    procs.refresh()
    assert procs.info(os.getpid()).replica is None
    attached.write_text(json.dumps([{**row, "node_ip": "127.0.0.1"}]))
    os.utime(attached, (1, 1))  # a new mtime, whatever the clock's resolution
    procs.refresh()
    assert procs.info(os.getpid()).attributes()["ray.serve.replica"] == "r1"


def test_this_hosts_addresses_include_loopback_and_its_interfaces() -> None:
    addresses = local_addresses()
    assert {"127.0.0.1", "::1"} <= addresses
    hostname = socket.gethostname()
    with contextlib.suppress(OSError):  # a host whose name does not resolve
        own = {str(a[4][0]) for a in socket.getaddrinfo(hostname, None, socket.AF_INET)}
        assert own <= addresses | {"127.0.1.1"}  # Debian's /etc/hosts alias is no interface


def test_an_unlisted_process_is_named_by_its_command() -> None:
    info = Processes().info(os.getpid())
    assert info.replica is None
    assert set(info.attributes()) == {"process.pid", "process.command"}


def test_ray_process_titles_give_app_and_deployment() -> None:
    info = _from_title(42, "ray::ServeRepli",
                       "ray::ServeReplica:minilm-v1:minilm-v1.handle_request_with_rejection ")
    assert info == ProcessInfo(42, "ray::ServeRepli", "minilm-v1", "minilm-v1")
    assert _from_title(7, "python", "python -m pytest") == ProcessInfo(7, "python")


def test_the_owner_of_a_local_port_is_found() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert Processes().owner_of_port(s.getsockname()[1]) == os.getpid()


def test_a_crashed_replica_keeps_its_identity_until_its_exit_is_reported(tmp_path: Path
                                                                        ) -> None:
    replicas = tmp_path / "serve-replicas.json"
    row = {"pid": 2**22 + 99, "app": "e", "deployment": "e", "replica": "r9", "model": "e",
           "version": "v1"}
    replicas.write_text(json.dumps([row]))
    procs = Processes(replicas)
    procs.refresh()
    replicas.write_text("[]")  # Serve noticed the crash first and rewrote the list
    os.utime(replicas, (2, 2))
    procs.refresh()
    assert procs.info(row["pid"]).replica == "r9"  # the exit event is still attributed
    procs.forget(row["pid"])
    assert procs.info(row["pid"]).replica is None


def test_a_node_collector_covers_its_nodes_replicas_and_what_runs_under_its_raylet(
        tmp_path: Path) -> None:
    """Two Ray nodes on one machine share a kernel: each node's collector keeps the
    replicas the actor table places on it and the processes its raylet started; the head's
    takes everything under no worker's raylet."""
    import subprocess
    import sys
    import time

    # A stand-in raylet with a child, as a worker node's raylet has its worker processes.
    raylet = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               "subprocess.Popen(['sleep', '60']).wait()"])
    try:
        child = None
        for _ in range(100):
            kids = Path(f"/proc/{raylet.pid}/task/{raylet.pid}/children").read_text().split()
            if kids:
                child = int(kids[0])
                break
            time.sleep(0.05)
        assert child is not None
        nodes = tmp_path / "ray-nodes.json"
        nodes.write_text(json.dumps([
            {"name": "head", "node_id": "aa", "raylet_pid": 1, "alive": True},
            {"name": "worker-1", "node_id": "bb", "raylet_pid": raylet.pid, "alive": True}]))
        replicas = tmp_path / "serve-replicas.json"
        replicas.write_text(json.dumps([{"pid": os.getpid(), "app": "a", "deployment": "a",
                                         "replica": "r-head", "model": "m", "version": "v1",
                                         "node_id": "aa", "node": "head"}]))
        head = Processes(replicas, node="head", nodes_file=nodes)
        worker = Processes(replicas, node="worker-1", nodes_file=nodes)
        everything = Processes(replicas)
        for p in (head, worker, everything):
            p.refresh()

        assert head.mine(os.getpid()) and not worker.mine(os.getpid())
        assert worker.info(os.getpid()).replica is None  # another node's replica
        assert worker.mine(child) and worker.mine(raylet.pid) and not head.mine(child)
        assert everything.mine(child) and everything.mine(os.getpid())
    finally:
        for pid in (child, raylet.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        raylet.wait()

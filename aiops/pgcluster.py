"""A throwaway PostgreSQL cluster on loopback, from the distribution's own binaries (Debian's
``postgresql`` package): the lake's catalog for tests, benchmarks and ``make demo-lake``.

PostgreSQL refuses to run as root; as root the cluster's files belong to the ``postgres`` user
and its binaries run as that user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from aiops.errors import AIOpsError
from aiops.ports import free_port

__all__ = ["PostgresCluster", "postgres_bindir"]

USER = "aiops"  # the cluster's superuser; trust authentication, on loopback only


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are: Debian keeps them off PATH, per major version."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise AIOpsError("PostgreSQL is not installed (Debian: `apt-get install postgresql`, which "
                     "`make install` does as root)")


class PostgresCluster:
    """``start()`` makes the cluster (first time) and starts it on ``port``; ``stop()`` and
    ``start()`` again restart it with its data; ``dsn(db)`` connects to database ``db``."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder.absolute()
        self.data = self.folder / "data"
        self.port = port or free_port()
        self.bindir = postgres_bindir()
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise AIOpsError("PostgreSQL does not run as root, and there is no `postgres` "
                                 "user to run it as") from exc
            self._as = ["runuser", "-u", "postgres", "--"]

    def dsn(self, database: str = "postgres") -> str:
        return f"dbname={database} host=127.0.0.1 port={self.port} user={USER}"

    def start(self) -> PostgresCluster:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.folder, "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "--no-sync",
                      "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l",
                  str(self.folder / "postgres.log"), "-o",
                  f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync=on", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """``fast``: clients disconnected, a clean shutdown; ``immediate``: as a crash."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def create_database(self, name: str) -> str:
        """A new, empty database; returns its connection string."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return self.dsn(name)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop("immediate")

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._as, str(self.bindir / tool), *args], capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode:
            raise AIOpsError(f"PostgreSQL {tool} failed ({done.returncode}): "
                             f"{(done.stderr or done.stdout).strip()[-500:]}")


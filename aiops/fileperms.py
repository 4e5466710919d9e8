"""Files only the aiops user may read: the data directory, the DuckDB file and its WAL, the
ledger anchors and the Parquet archive hold every span, log, prompt hash and ledger entry.

Three layers, because DuckDB creates some of these files itself and at times of its choosing
(the WAL is deleted at each checkpoint and created again by the next write; a spill folder
``<db>.tmp`` appears under memory pressure):

- ``aiops server`` sets the process umask to 077 before it opens anything
  (``private_umask``), so every file and folder that process creates is private from the
  first byte, whichever library creates it.
- The store makes the files it knows private itself (``private_file``), for any process that
  uses it (``aiops ledger verify --offline``, benchmarks, tests): the database file at open,
  the WAL after each write, anchors and archive files as they are written.
- A data directory aiops creates is 0700 (``private_dir``). One that already exists and is
  open to others is left as it is, with a warning: it may be a directory the user chose for
  other things too (their home, a shared volume), and the files in it are private anyway.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "private_dir", "private_file", "private_umask"]

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def private_umask() -> int:
    """Make every file this process creates from now on private (umask 077); the old umask.

    Process-wide: call it once at the start of a process that owns the data (``aiops
    server``), before threads start, never from a library function."""
    return os.umask(0o077)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) if it is not there, the last one 0700; warn if it
    exists and others may enter or list it. Returns ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        try:
            mode = path.stat().st_mode
        except OSError:
            return path
        if stat.S_ISDIR(mode) and mode & _OTHERS:
            log.warning("%s is open to other users (mode %o); aiops keeps its own files in "
                        "it private (0600), but `chmod 700 %s` closes it too", path,
                        stat.S_IMODE(mode), path)
        return path
    os.chmod(path, PRIVATE_DIR)  # mkdir's mode is masked by the umask; be exact
    return path


def private_file(path: Path) -> None:
    """Take group and other permissions off ``path`` if it exists and has any (0600 for an
    ordinary file); a file this process may not change is reported, not fatal."""
    try:
        mode = path.stat().st_mode
        if mode & _OTHERS:
            os.chmod(path, stat.S_IMODE(mode) & ~_OTHERS)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("cannot make %s private: %s", path, exc.strerror or exc)

"""The Slack signatures already used, kept on disk so that a signed slash command is accepted
once, a restart of the server included.

A Slack request is valid for five minutes either side of its timestamp; its signature (an
HMAC of the timestamp and the body) names it. Each signature used is appended, with the time
it may be forgotten, to ``<data_dir>/slack-seen.log`` (mode 0600) and fsynced *before* the
request is accepted; the file is read back at start. Entries whose timestamp has left the
window are dropped (from memory at each use, from the file when it is rewritten: at start,
and whenever more than half of its lines are dead), and at most ``cap`` are kept: when full, a
new request waits (the caller answers 503) rather than anything being forgotten early. The
file therefore holds at most ``2 * cap + 64`` lines of ~80 bytes.

One server process owns a data dir (DuckDB's lock on the store sees to that); two processes
sharing this file would each refuse only their own replays.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiops.errors import ConfigError

__all__ = ["SEEN_FILE", "SeenSignatures"]

log = logging.getLogger(__name__)

SEEN_FILE = "slack-seen.log"
_SIGNATURE = re.compile(r"[\x21-\x7e]{1,256}")  # one printable token: a line holds one
_SLACK = 64  # dead lines tolerated before the file is rewritten, beyond half of it


class SeenSignatures:
    """Signatures used within the window, so that a replay is refused; each is forgotten once
    its timestamp is out of the window, and at most ``cap`` are kept. With ``path``, they are
    on disk first (see the module's doc), and those there are loaded now."""

    def __init__(self, window_s: int, cap: int, clock: Callable[[], float] = time.time,
                 path: Path | None = None) -> None:
        self.window_s, self.cap, self.clock, self.path = window_s, cap, clock, path
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []
        self._lines = 0  # lines in the file, live or dead
        if path is not None:
            self._load(path)

    def use(self, signature: str, stamp: int) -> float | None:
        """Record ``signature`` (of a request stamped ``stamp``): None when new, and then on
        disk already; 0 when replayed; when full, the seconds until room is made. OSError
        when it cannot be recorded (the request must then be refused)."""
        if not _SIGNATURE.fullmatch(signature):
            raise ValueError("a signature is one printable ASCII token")
        now = self.clock()
        with self._lock:
            self._prune(now)
            if signature in self._until:
                return 0.0
            if len(self._until) >= self.cap:
                return max(1.0, self._expiry[0][0] - now)
            until = float(stamp + self.window_s + 1)
            if self.path is not None:
                self._append(self.path, signature, until)
            self._until[signature] = until
            heapq.heappush(self._expiry, (until, signature))
            if self.path is not None and self._lines >= 2 * len(self._until) + _SLACK:
                try:
                    self._rewrite(self.path)
                except OSError as exc:  # the appended file still holds every entry
                    log.warning("cannot compact %s: %s", self.path, exc)
            return None

    def __len__(self) -> int:
        with self._lock:
            self._prune(self.clock())
            return len(self._until)

    def _prune(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            self._until.pop(heapq.heappop(self._expiry)[1], None)

    def _load(self, path: Path) -> None:
        """The file's live entries into memory; then the file rewritten with just those (which
        also drops a line a crash cut short: its request was never accepted)."""
        now = self.clock()
        try:
            text = path.read_bytes().decode("ascii", "replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigError(f"cannot read the Slack replay record {path}: "
                              f"{exc.strerror or exc}") from exc
        for line in text.split("\n")[:-1]:  # the last is "" or a line a crash cut short
            until_text, _, signature = line.partition(" ")
            if not until_text.isdigit() or len(until_text) > 12 \
                    or not _SIGNATURE.fullmatch(signature):
                continue
            until = float(until_text)
            if until >= now and until > self._until.get(signature, 0.0):
                self._until[signature] = until
        self._expiry = [(u, s) for s, u in self._until.items()]
        heapq.heapify(self._expiry)
        try:
            self._rewrite(path)
        except OSError as exc:
            raise ConfigError(f"cannot rewrite the Slack replay record {path}: "
                              f"{exc.strerror or exc}") from exc

    def _append(self, path: Path, signature: str, until: float) -> None:
        created = not path.exists()
        if created:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        try:
            line = f"{until:.0f} {signature}\n".encode("ascii")
            if os.write(fd, line) != len(line):
                raise OSError(f"short write to {path}")
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(path.parent)
        self._lines += 1

    def _rewrite(self, path: Path) -> None:
        """The live entries, written to a private file that then replaces ``path``."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            try:
                data = "".join(f"{u:.0f} {s}\n" for s, u in self._until.items())
                view = memoryview(data.encode("ascii"))
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(path.parent)
        self._lines = len(self._until)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

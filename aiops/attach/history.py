"""The Serve configs aiops saw run healthy, per attached Ray cluster: what a rollback
re-applies.

A config becomes "healthy" once its application has been RUNNING on it for
``healthy_after_s`` with no open incident on its service and version. The last few healthy
configs per application are kept in ``<data_dir>/attach/<target>.json`` (written atomically),
so a rollback still has its target after the server restarts.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiops.attach.ray_serve import ServeApp

__all__ = ["ConfigHistory", "Healthy"]

log = logging.getLogger(__name__)

KEEP = 5  # healthy configs kept per application


@dataclass(frozen=True)
class Healthy:
    version: str
    config: dict[str, Any]
    healthy_ns: int


def _troubled(app: ServeApp, troubled: set[tuple[str, str]]) -> bool:
    """Whether an open incident names a release of this app: any of its deployments' service
    at the version it runs, or one of its services with no version (telemetry that names no
    release cannot clear one)."""
    services = set(app.services)
    return bool(app.releases() & troubled) or any(
        s in services and not v for s, v in troubled)


class ConfigHistory:
    def __init__(self, path: Path, healthy_after_s: float) -> None:
        self.path = path
        self.healthy_after_ns = int(healthy_after_s * 1e9)
        self._lock = threading.Lock()
        self._healthy: dict[str, list[Healthy]] = self._load()
        # (app, version) -> since when it has run with no open incident (not persisted: a
        # restart starts the clock again, the safe side).
        self._since: dict[tuple[str, str], int] = {}

    def _load(self) -> dict[str, list[Healthy]]:
        try:
            raw = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as exc:
            log.error("ignoring unreadable config history %s: %s", self.path, exc)
            return {}
        return {app: [Healthy(h["version"], h["config"], int(h["healthy_ns"])) for h in hs]
                for app, hs in raw.items()}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({app: [h.__dict__ for h in hs]
                                      for app, hs in self._healthy.items()}))
        os.replace(tmp, self.path)

    def observe(self, apps: list[ServeApp], troubled: set[tuple[str, str]], now_ns: int
                ) -> list[tuple[str, str]]:
        """Record one reading of the cluster; ``troubled`` holds the (service, version) pairs
        with an open incident (version "" where the incident names none). Returns the (app,
        version) pairs that just became healthy."""
        became = []
        with self._lock:
            current = set()
            for app in apps:
                key = (app.name, app.version)
                if app.config is None or app.status != "RUNNING" \
                        or _troubled(app, troubled):
                    self._since.pop(key, None)
                    continue
                current.add(key)
                since = self._since.setdefault(key, now_ns)
                kept = self._healthy.get(app.name, [])
                if now_ns - since < self.healthy_after_ns or (
                        kept and kept[-1].version == app.version
                        and kept[-1].config == app.config):
                    continue
                others = [h for h in kept if h.version != app.version]
                self._healthy[app.name] = [*others, Healthy(app.version, app.config,
                                                            now_ns)][-KEEP:]
                became.append(key)
            for key in set(self._since) - current:
                del self._since[key]
            if became:
                self._save()
        return became

    def healthy(self, app: str) -> list[Healthy]:
        """Healthy configs of ``app``, oldest first."""
        with self._lock:
            return list(self._healthy.get(app, []))

    def last_healthy(self, app: str, other_than: str | None = None) -> Healthy | None:
        for h in reversed(self.healthy(app)):
            if h.version != other_than:
                return h
        return None

"""The server's view of attached serving: targets from the configuration and from
``<data_dir>/attach.json`` (``aiops attach add``; re-read when it changes), a background
reading of each Ray cluster's Serve applications into its ``ConfigHistory``, vLLM servers'
models, the scrape targets they add, and the control planes remediation acts through.

A target that cannot be read is logged, counted and read again next round.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from pydantic import TypeAdapter, ValidationError

from aiops.analytics.topology import ServiceMap
from aiops.attach.control import ServeControl, VllmControl
from aiops.attach.history import ConfigHistory
from aiops.attach.ray_serve import RayServe, ServeApp, service_map
from aiops.config import AttachTarget, Settings
from aiops.datadir import ATTACHED_REPLICAS_FILE
from aiops.errors import AIOpsError, ConfigError
from aiops.periodic import Health, Periodic, PeriodicMetrics
from collectors.prometheus import Target

__all__ = ["MANAGED_FILE", "Attachment", "load_managed", "save_managed", "targets_of"]

log = logging.getLogger(__name__)

MANAGED_FILE = "attach.json"
MAX_MANAGED_BYTES = 1 * 2**20
_TARGETS = TypeAdapter(list[AttachTarget])


def load_managed(data_dir: Path) -> list[AttachTarget]:
    path = data_dir / MANAGED_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_MANAGED_BYTES:
        raise ConfigError(f"{path} is {len(raw)} bytes, over {MAX_MANAGED_BYTES}")
    try:
        return _TARGETS.validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc.errors()[0]['msg']} at "
                          f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}") from exc


def save_managed(data_dir: Path, targets: list[AttachTarget]) -> Path:
    path = data_dir / MANAGED_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps([t.model_dump(mode="json", exclude_none=True)
                                  for t in targets], option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class AttachSettings:
    """What the attachment reads of the server's settings (``AIOPS_ATTACH*``): the targets
    configured, where it keeps what it learns, and how often it looks."""

    data_dir: Path
    configured: tuple[AttachTarget, ...] = ()
    interval_s: float = 5.0
    healthy_after_s: float = 60.0

    @classmethod
    def of(cls, s: Settings) -> AttachSettings:
        return cls(Path(s.data_dir), tuple(s.attach), s.attach_interval_s,
                   s.attach_healthy_after_s)


def targets_of(settings: Settings | AttachSettings) -> list[AttachTarget]:
    """Configured targets, then those ``aiops attach add`` kept; names must be unique."""
    configured = settings.configured if isinstance(settings, AttachSettings) else settings.attach
    out = [*configured, *load_managed(settings.data_dir)]
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ConfigError(f"two attach targets are named {t.name}")
        seen.add(t.name)
    return out


def vllm_served(target: AttachTarget, timeout_s: float = 5.0) -> dict[str, str]:
    """The model names a vLLM server serves (``GET /v1/models``: ``--served-model-name``), each
    with its ``root`` (the weights it loaded: a path or a Hugging Face id)."""
    token = target.token()
    try:
        resp = httpx.get(f"{target.url.rstrip('/')}/v1/models", timeout=timeout_s,
                         headers={"authorization": f"Bearer {token}"} if token else {})
        resp.raise_for_status()
        return {str(m["id"]): str(m.get("root") or m["id"])
                for m in resp.json().get("data", [])[:64]}
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AIOpsError(f"cannot list the models of vLLM server {target.name} "
                         f"({target.url}): {exc}") from exc


def vllm_models(target: AttachTarget, timeout_s: float = 5.0) -> list[str]:
    return list(vllm_served(target, timeout_s))


def model_tag(root: str) -> str:
    """What stands for a vLLM model's version: the last part of the weights' path or id
    (``/models/Llama-3.1-8B-Instruct-v2`` -> ``Llama-3.1-8B-Instruct-v2``)."""
    return (root.rstrip("/").rsplit("/", 1)[-1] or root)[:128]


def scrape_target(target: AttachTarget, version: str | None = None) -> Target | None:
    if target.kind == "vllm":
        return Target(target.name, target.metrics_url or f"{target.url.rstrip('/')}/metrics",
                      kind="vllm", version=version)
    if target.metrics_url:
        return Target(target.name, target.metrics_url)
    return None


class Attachment:
    def __init__(self, settings: AttachSettings,
                 troubled: Callable[[], set[tuple[str, str]]] = set,
                 on_targets: Callable[[list[Target]], None] | None = None,
                 on_calls: Callable[[ServiceMap], None] | None = None,
                 metrics: PeriodicMetrics | None = None) -> None:
        self.settings = settings
        self._troubled = troubled
        self._on_targets = on_targets
        self._on_calls = on_calls
        self._calls = ServiceMap()
        self._replica_rows: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._mtime: float | None = -1.0
        self.targets: list[AttachTarget] = []
        self.histories: dict[str, ConfigHistory] = {}
        self.apps: dict[str, list[ServeApp]] = {}
        self.models: dict[str, list[str]] = {}
        self.tags: dict[str, str | None] = {}
        self.errors: dict[str, str] = {}
        self._worker = Periodic("attach", settings.interval_s, self.read_once, run_first=True,
                                metrics=metrics)
        self._reload()

    def _reload(self) -> None:
        path = self.settings.data_dir / MANAGED_FILE
        try:
            mtime: float | None = path.stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        targets = targets_of(self.settings)
        with self._lock:
            self._mtime = mtime
            self.targets = targets
            # What a removed target showed goes with it: its replicas, calls and models.
            names = {t.name for t in targets}
            for seen in (self.apps, self.models, self.tags, self.errors):
                for name in [n for n in seen if n not in names]:
                    del seen[name]
            for t in targets:
                if t.kind == "ray" and t.name not in self.histories:
                    self.histories[t.name] = ConfigHistory(
                        self.settings.data_dir / "attach" / f"{t.name}.json",
                        self.settings.healthy_after_s)
        self._push_targets()
        log.info("attached targets: %s", ", ".join(f"{t.kind}:{t.name}" for t in targets)
                 or "none")

    def _push_targets(self) -> None:
        if self._on_targets is not None:
            scraped = (scrape_target(t, self.tags.get(t.name)) for t in list(self.targets))
            self._on_targets([s for s in scraped if s is not None])

    def read_once(self, now_ns: int | None = None) -> None:
        try:
            self._reload()
        except ConfigError as exc:
            log.error("keeping the previous attach targets: %s", exc)
        now = now_ns or time.time_ns()
        troubled = self._troubled()
        for t in list(self.targets):
            try:
                if t.kind == "ray":
                    with RayServe(t) as rest:
                        apps = rest.applications()
                    became = self.histories[t.name].observe(apps, troubled, now)
                    for app, version in became:
                        log.info("%s: Serve application %s version %s is healthy; a "
                                 "rollback re-applies it", t.name, app, version)
                    self.apps[t.name] = apps
                else:
                    served = vllm_served(t)
                    self.models[t.name] = list(served)
                    tag = model_tag(next(iter(served.values()))) if served else None
                    if tag != self.tags.get(t.name):
                        self.tags[t.name] = tag
                        self._push_targets()  # the scraped rows carry the new tag
                self.errors.pop(t.name, None)
            except AIOpsError as exc:
                if self.errors.get(t.name) != str(exc):
                    log.warning("attached target %s: %s", t.name, exc)
                self.errors[t.name] = str(exc)
        self._write_replicas()
        calls = self.service_map()
        if calls != self._calls:
            self._calls = calls
            log.info("Serve deployment graph: %s", ", ".join(
                f"{a} -> {b}" for a, b in sorted(calls.edges)) or "no calls between services")
            if self._on_calls is not None:
                self._on_calls(calls)

    def replica_rows(self) -> list[dict[str, Any]]:
        """Every attached Serve replica's process, in the eBPF collector's replica-file
        format: its kernel measurements then name the app's service, version and replica."""
        return [{"pid": pid, "app": app.name, "deployment": d.name, "replica": replica,
                 "model": app.service_of(d.name), "version": app.version_of(d.name),
                 "node_ip": node,
                 "target": target}
                for target, apps in sorted(self.apps.items()) for app in apps
                for d in app.deployments for replica, pid, node in d.processes]

    def _write_replicas(self) -> None:
        rows = self.replica_rows()
        if rows == self._replica_rows:
            return
        path = self.settings.data_dir / ATTACHED_REPLICAS_FILE
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
            tmp.replace(path)  # the collector never reads half a file
            self._replica_rows = rows
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)

    def service_map(self) -> ServiceMap:
        """Calls between services read off every attached cluster's Serve deployment graph."""
        return functools.reduce(lambda a, b: a | b,
                                (service_map(apps) for apps in list(self.apps.values())),
                                ServiceMap())

    def planes(self) -> list[Callable[[], Any]]:
        """Factories of the attached targets' control planes (for ``Planes``)."""
        return [functools.partial(ServeControl, t, self.histories[t.name]) if t.kind == "ray"
                else functools.partial(VllmControl, t, functools.partial(self._models_of, t.name),
                                       functools.partial(self.tags.get, t.name))
                for t in list(self.targets)]

    def _models_of(self, name: str) -> list[str]:
        return self.models.get(name, [])

    def describe(self) -> dict[str, Any]:
        out = []
        for t in list(self.targets):
            item: dict[str, Any] = {"kind": t.kind, "name": t.name, "url": t.url,
                                    "error": self.errors.get(t.name)}
            if t.kind == "ray":
                history = self.histories[t.name]
                item["applications"] = [
                    {"name": a.name, "service": a.service, "version": a.version,
                     "status": a.status, "declarative": a.config is not None,
                     "healthy_versions": [h.version for h in history.healthy(a.name)],
                     "deployments": [{"name": d.name, "service": a.service_of(d.name),
                                      "version": a.version_of(d.name), "status": d.status,
                                      "replicas": list(d.replicas)} for d in a.deployments]}
                    for a in self.apps.get(t.name, [])]
            else:
                item["models"] = self.models.get(t.name, [])
                item["version"] = self.tags.get(t.name)
            out.append(item)
        return {"targets": out}

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        self._worker.close(timeout_s=15)

    def health(self) -> Health:
        return self._worker.health()

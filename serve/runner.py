"""The Serve driver process: starts its own local Ray instance, runs the app, watches it, and on
SIGTERM tears down exactly that instance (``ray stop`` would kill every Ray process on the
machine).

Watching happens here, not in the ingress: ``serve.status()`` is a controller RPC that costs a
request path tens of milliseconds when it runs inside a replica. Every few seconds the driver
exports ``aiops.serve.replicas`` and ``aiops.serve.deployment.healthy`` per model deployment.
Once ``serve.run`` returns (every deployment running) it writes ``<data_dir>/serve.ready``,
which ``aiops up`` waits for.

Run as ``python -m serve.runner``; settings come from ``AIOPS_*`` like every aiops process.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from aiops.config import Settings, load_settings
from aiops.logs import configure_json_logging
from serve.app import APP_NAME, build_app
from serve.options import ServeOptions
from serve.telemetry import Telemetry, attrs

__all__ = ["READY_FILE", "ServeWatcher", "main", "run"]

log = logging.getLogger(__name__)

READY_FILE = "serve.ready"
POLL_S = 2.0


class ServeWatcher:
    """Polls Serve's status and exposes it as gauges (per model deployment)."""

    def __init__(self, options: ServeOptions, telemetry: Telemetry) -> None:
        self.options = options
        self.by_deployment = {s.deployment_name: s for s in options.specs}
        self.replicas: dict[str, int] = {}
        self.healthy: dict[str, int] = {}
        meter = telemetry.meter
        meter.create_observable_gauge(
            "aiops.serve.replicas", callbacks=[self._observe(self.replicas)], unit="{replica}",
            description="Running replicas per model deployment")
        meter.create_observable_gauge(
            "aiops.serve.deployment.healthy", callbacks=[self._observe(self.healthy)], unit="1",
            description="1 when Serve reports the model deployment HEALTHY")

    def _observe(self, source: dict[str, int]) -> Any:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            for name, value in list(source.items()):
                spec = self.by_deployment[name]
                yield Observation(value, {attrs.GEN_AI_REQUEST_MODEL: spec.name,
                                          attrs.MODEL_VERSION: spec.version,
                                          attrs.SERVE_DEPLOYMENT: name})

        return callback

    def poll(self) -> None:
        from ray import serve
        from ray.serve.schema import ReplicaState  # type: ignore[attr-defined]

        try:
            app = serve.status().applications[self.options.app_name]
        except Exception as exc:  # noqa: BLE001 - watching must never stop serving
            log.warning("serve.status() failed: %s", exc)
            return
        for name, dep in app.deployments.items():
            if name in self.by_deployment:
                self.replicas[name] = int(dep.replica_states.get(ReplicaState.RUNNING, 0))
                # Scaling deployments still serve; UPDATING/UNHEALTHY ones may not.
                self.healthy[name] = int(dep.status in ("HEALTHY", "UPSCALING", "DOWNSCALING"))


def run(settings: Settings, stop: threading.Event) -> None:
    import ray
    from ray import serve

    options = ServeOptions.from_settings(settings)  # bad specs fail before Ray starts
    ready = Path(settings.data_dir) / READY_FILE
    ready.unlink(missing_ok=True)
    telemetry = Telemetry(options.telemetry, {attrs.SERVICE_NAME: "serve-driver",
                                              attrs.SERVE_APP: APP_NAME}, component="driver")
    # address="local" always starts a new instance, never joins someone else's cluster.
    ray.init(address="local", num_cpus=settings.ray_num_cpus, include_dashboard=False,
             logging_level=logging.WARNING, namespace=APP_NAME)
    try:
        serve.start(http_options={"host": settings.serve_host, "port": settings.serve_port})
        serve.run(build_app(options), name=APP_NAME, route_prefix="/")
        watcher = ServeWatcher(options, telemetry)
        watcher.poll()
        ready.write_text("ready\n")
        log.info("serve application %s ready at %s", APP_NAME, settings.serve_url)
        while not stop.wait(POLL_S):
            watcher.poll()
        log.info("stopping serve application")
        ready.unlink(missing_ok=True)
        serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
        ready.unlink(missing_ok=True)
        telemetry.shutdown()
        ray.shutdown()


def main() -> None:
    settings = load_settings()
    configure_json_logging(settings.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(settings, stop)


if __name__ == "__main__":
    main()

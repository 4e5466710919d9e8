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

import json
import logging
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from aiops.auth import ADMIN_TOKEN_FILE, ensure_secret, stack_credential
from aiops.config import Settings, load_settings
from aiops.datadir import NODES_FILE, REPLICAS_FILE
from aiops.logs import configure_json_logging
from serve.app import APP_NAME
from serve.cluster import start_ray
from serve.control import DeployFailed, ServeControl
from serve.control_api import create_control_app
from serve.gates import Trust
from serve.nodes import NodeWatcher
from serve.options import ServeOptions
from serve.specs import ModelSpec
from serve.telemetry import Telemetry, attrs
from serve.throughput import http_front

__all__ = ["READY_FILE", "ServeWatcher", "main", "run"]

log = logging.getLogger(__name__)

READY_FILE = "serve.ready"
STATE_FILE = "serve-state.json"
POLL_S = 2.0


class ServeWatcher:
    """Polls Serve's status and exposes it as gauges (per model deployment)."""

    def __init__(self, options: ServeOptions, telemetry: Telemetry,
                 replicas_file: Path | None = None, nodes: NodeWatcher | None = None) -> None:
        self.options = options
        self.replicas_file = replicas_file
        self.nodes = nodes
        self.by_deployment = {s.deployment_name: s for s in options.specs}
        self.app_name = options.app_name
        self.replicas: dict[str, int] = {}
        self.healthy: dict[str, int] = {}
        meter = telemetry.meter
        meter.create_observable_gauge(
            "aiops.serve.replicas", callbacks=[self._observe("replicas")], unit="{replica}",
            description="Running replicas per model deployment")
        meter.create_observable_gauge(
            "aiops.serve.deployment.healthy", callbacks=[self._observe("healthy")], unit="1",
            description="1 when Serve reports the model deployment HEALTHY")

    def update_specs(self, specs: list[ModelSpec]) -> None:
        self.by_deployment = {s.deployment_name: s for s in specs}

    def _observe(self, attribute: str) -> Any:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            source: dict[str, int] = getattr(self, attribute)
            for name, value in source.items():
                spec = self.by_deployment.get(name)
                if spec is None:  # a version that was just removed
                    continue
                yield Observation(value, {attrs.GEN_AI_REQUEST_MODEL: spec.name,
                                          attrs.MODEL_VERSION: spec.version,
                                          attrs.SERVE_DEPLOYMENT: name})

        return callback

    def poll(self) -> None:
        from ray import serve
        from ray.serve.schema import ReplicaState  # type: ignore[attr-defined]

        try:
            apps = serve.status().applications
        except Exception as exc:  # noqa: BLE001 - watching must never stop serving
            log.warning("serve.status() failed: %s", exc)
            return
        running, healthy, settled = {}, {}, {}
        deployments = [(n, d) for app in apps.values() for n, d in app.deployments.items()]
        for name, dep in deployments:
            running[name] = int(dep.replica_states.get(ReplicaState.RUNNING, 0))
            # Scaling deployments still serve; UPDATING/UNHEALTHY ones may not.
            healthy[name] = int(dep.status in ("HEALTHY", "UPSCALING", "DOWNSCALING"))
            settled[name] = dep.status == "HEALTHY"
        # Swapped whole: the metrics thread reads these while we poll. The gauges are the
        # models'; the node watch also follows the ingress.
        self.replicas = {n: v for n, v in running.items() if n in self.by_deployment}
        self.healthy = {n: v for n, v in healthy.items() if n in self.by_deployment}
        rows = self._replica_rows()
        if rows is None:
            return
        if self.replicas_file is not None:
            tmp = self.replicas_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            tmp.replace(self.replicas_file)
        if self.nodes is not None:
            self.nodes.poll(rows, running, settled)

    def _replica_rows(self) -> list[dict[str, Any]] | None:
        """Which process is which Serve replica on which node, from Ray's actor table (GCS;
        no dashboard needed). Actor names are ``SERVE_REPLICA::<app>#<deployment>#<id>``."""
        try:
            from ray._private import state

            actors = state.actors().values()
        except Exception as exc:  # noqa: BLE001 - attribution is best effort
            log.warning("could not list Ray actors: %s", exc)
            return None
        names = self.nodes.cluster.names if self.nodes is not None else {}
        rows = []
        for actor in actors:
            name, pid = actor.get("Name") or "", actor.get("Pid")
            if actor.get("State") != "ALIVE" or not pid or not name.startswith("SERVE_REPLICA::"):
                continue
            app, _, rest = name.removeprefix("SERVE_REPLICA::").partition("#")
            deployment, _, replica = rest.partition("#")
            spec = self.by_deployment.get(deployment)
            node_id = str((actor.get("Address") or {}).get("NodeID") or "")
            rows.append({"pid": int(pid), "app": app, "deployment": deployment,
                         "replica": replica, "model": spec.name if spec else None,
                         "version": spec.version if spec else None,
                         "node_id": node_id, "node": names.get(node_id)})
        return rows


def _failure(app: Any) -> str:
    """Why an application failed: its failed deployments' last message lines (the replica's
    exception, e.g. a refused key or a failed warm-up), else the application's own."""
    lines = [d.message.strip().splitlines()[-1] for d in app.deployments.values()
             if d.status == "DEPLOY_FAILED" and (d.message or "").strip()]
    if lines:
        return "; ".join(lines)
    own = (app.message or "").strip().splitlines()
    return own[-1] if own else "deploy failed"


def ray_deployer(client: Any, timeout_s: float) -> Any:
    """Deploy a ServeDeploySchema document and wait until every application in it runs."""

    def deploy(config: dict[str, Any]) -> None:
        from ray import serve
        from ray.serve.schema import ServeDeploySchema

        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=False)
        names = {a["name"] for a in config["applications"]}
        deadline = time.monotonic() + timeout_s
        time.sleep(0.5)  # let the controller pick the new config up before judging status
        while True:
            apps = serve.status().applications
            failed = {n: _failure(apps[n]) for n in names
                      if n in apps and apps[n].status == "DEPLOY_FAILED"}
            if failed:
                raise DeployFailed("; ".join(f"{n}: {m}" for n, m in failed.items()))
            done = all(n in apps and apps[n].status == "RUNNING" and all(
                d.status in ("HEALTHY", "UPSCALING", "DOWNSCALING")
                for d in apps[n].deployments.values()) for n in names)
            if done and not set(apps) - names:
                return
            if time.monotonic() > deadline:
                pending = {n: apps[n].status if n in apps else "absent" for n in names}
                raise DeployFailed(f"not running after {timeout_s:.0f} s: {pending}")
            time.sleep(0.25)

    return deploy


def replica_tester(spec: ModelSpec) -> dict[str, Any]:
    """Run the run-time gate inside one replica of the (still unrouted) version."""
    from ray import serve

    handle = serve.get_deployment_handle(spec.deployment_name, app_name=spec.deployment_name)
    try:
        report: dict[str, Any] = handle.self_test.remote().result(
            timeout_s=spec.qos.timeout_s + 60)
    except Exception as exc:  # noqa: BLE001 - a replica that cannot test itself fails
        return {"ok": False, "reason": f"self-test did not complete: {exc}"}
    return report


def admin_token(settings: Settings) -> str:
    """The control plane's token: configured, or generated once and kept for the CLI (0600,
    written whole: never readable empty)."""
    if settings.admin_token:
        return settings.admin_token
    return ensure_secret(Path(settings.data_dir) / ADMIN_TOKEN_FILE)


def run(settings: Settings, stop: threading.Event) -> None:
    """Ray, the Serve app and the control API until ``stop``; ``serve_proxy`` says what takes
    HTTP in front (serve.throughput)."""
    with http_front(settings.serve_proxy):
        _run(settings, stop)


def _run(settings: Settings, stop: threading.Event) -> None:
    import ray
    import uvicorn
    from ray import serve
    from ray.serve._private.api import serve_start

    # bad specs fail before Ray starts; the exporters carry the stack's own ingest credential
    options = ServeOptions.from_settings(
        settings, ingest_token=stack_credential(Path(settings.data_dir), "serve"))
    ready = Path(settings.data_dir) / READY_FILE
    ready.unlink(missing_ok=True)
    telemetry = Telemetry(options.telemetry, {attrs.SERVICE_NAME: "serve-driver",
                                              attrs.SERVE_APP: APP_NAME}, component="driver")
    cluster = start_ray(settings, APP_NAME)
    admin: uvicorn.Server | None = None
    try:
        client = serve_start(http_options={"host": settings.serve_host,
                                           "port": settings.serve_port})
        control = ServeControl(
            list(options.specs), options.telemetry,
            {"api_keys": list(options.api_keys), "max_request_bytes": options.max_request_bytes},
            ray_deployer(client, settings.startup_timeout_s),
            state_file=Path(settings.data_dir) / STATE_FILE, tester=replica_tester,
            trust=Trust.from_setting(settings.strict_packages, settings.trusted_keys),
            # The head's CPUs: the replicas must fit on it once a worker node is lost.
            cluster_cpus=float(settings.ray_num_cpus))
        control.deploy()
        nodes = NodeWatcher(cluster, telemetry, Path(settings.data_dir) / NODES_FILE)
        watcher = ServeWatcher(options, telemetry, Path(settings.data_dir) / REPLICAS_FILE,
                               nodes)
        watcher.poll()
        admin = uvicorn.Server(uvicorn.Config(
            create_control_app(control, admin_token(settings)), host=settings.serve_host,
            port=settings.control_port, log_level="warning", access_log=False,
            log_config=None))
        threading.Thread(target=admin.run, daemon=True, name="control-api").start()
        ready.write_text("ready\n")
        log.info("serve application %s ready at %s", APP_NAME, settings.serve_url)
        while not stop.wait(POLL_S):
            watcher.update_specs(control.specs)
            watcher.poll()
        log.info("stopping serve application")
        ready.unlink(missing_ok=True)
        serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
        if admin is not None:
            admin.should_exit = True
        ready.unlink(missing_ok=True)
        (Path(settings.data_dir) / REPLICAS_FILE).unlink(missing_ok=True)
        (Path(settings.data_dir) / NODES_FILE).unlink(missing_ok=True)
        telemetry.shutdown()
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    settings = load_settings()
    configure_json_logging(settings.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(settings, stop)


if __name__ == "__main__":
    main()

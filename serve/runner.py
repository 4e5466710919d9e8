"""The Serve driver process: starts its own local Ray instance, runs the app, and on SIGTERM
tears down exactly that instance (``ray stop`` would kill every Ray process on the machine).

Run as ``python -m serve.runner``; settings come from ``AIOPS_*`` like every aiops process.
"""

from __future__ import annotations

import logging
import signal
import threading

from aiops.config import Settings, load_settings
from aiops.logs import configure_json_logging
from serve.app import APP_NAME, build_app
from serve.options import ServeOptions

__all__ = ["main", "run"]

log = logging.getLogger(__name__)


def run(settings: Settings, stop: threading.Event) -> None:
    import ray
    from ray import serve

    options = ServeOptions.from_settings(settings)  # bad specs fail before Ray starts
    # address="local" always starts a new instance, never joins someone else's cluster.
    ray.init(address="local", num_cpus=settings.ray_num_cpus, include_dashboard=False,
             logging_level=logging.WARNING, namespace=APP_NAME)
    try:
        serve.start(http_options={"host": settings.serve_host, "port": settings.serve_port})
        serve.run(build_app(options), name=APP_NAME,
                  route_prefix="/")
        log.info("serve application %s ready at %s", APP_NAME, settings.serve_url)
        stop.wait()
        log.info("stopping serve application")
        serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
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

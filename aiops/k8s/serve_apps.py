"""Serve application builders for Kubernetes: ``serve.app``'s, with secrets read from files.

In a RayService, ``serveConfigV2`` is a field of a custom resource: readable by whoever may
read RayService objects (RBAC rarely guards those like Secrets), printed by ``kubectl get -o
yaml`` and served back by the Ray dashboard's Serve API. So ``aiops k8s render`` writes no
secret there: the Serve applications' arguments name files instead, which the Ray pods mount
from the Secret ``aiops-credentials``:

- ``telemetry.token_file``: the ``serve`` ingest token the replicas' OTLP exporters send;
- ``api_keys_file`` (the ingress): the OpenAI endpoints' API keys, one per line or
  comma-separated.

The builders here (import paths ``aiops.k8s.serve_apps:ingress_app`` and ``:model_app``)
read those files where Serve builds the applications, in the cluster, and hand
``serve.app``'s builders the arguments they always took (``telemetry.token``,
``api_keys``). A named file that is missing or empty fails the build (so the RayService
reports it) rather than leaving the endpoints open or the exports anonymous.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["by_reference", "ingress_app", "model_app", "read_secret", "resolve_ingress_args",
           "resolve_model_args"]

# serve.app's builders -> the ones here.
_BUILDERS = {"serve.app:ingress_app": f"{__name__}:ingress_app",
             "serve.app:model_app": f"{__name__}:model_app"}


def read_secret(path: str | Path) -> str:
    """A mounted secret's value, stripped; never part of an error message."""
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise RuntimeError(f"secret file {path} cannot be read: {exc.strerror}") from None
    if not value:
        raise RuntimeError(f"secret file {path} is empty")
    return value


def _telemetry(telemetry: dict[str, Any]) -> dict[str, Any]:
    tele = dict(telemetry)
    path = tele.pop("token_file", None)
    if path is not None:
        tele["token"] = read_secret(path)
    return tele


def resolve_ingress_args(args: dict[str, Any]) -> dict[str, Any]:
    """The ingress's arguments with ``api_keys_file`` and the telemetry's ``token_file``
    read into ``api_keys`` and ``token``."""
    out = dict(args)
    path = out.pop("api_keys_file", None)
    if path is not None:
        out["api_keys"] = [k.strip() for k in re.split(r"[,\n]", read_secret(path))
                           if k.strip()]
    out["telemetry"] = _telemetry(out["telemetry"])
    return out


def resolve_model_args(args: dict[str, Any]) -> dict[str, Any]:
    return {**args, "telemetry": _telemetry(args["telemetry"])}


def ingress_app(args: dict[str, Any]) -> Any:
    from serve.app import ingress_app as build

    return build(resolve_ingress_args(args))


def model_app(args: dict[str, Any]) -> Any:
    from serve.app import model_app as build

    return build(resolve_model_args(args))


def by_reference(config: dict[str, Any], token_file: str, api_keys_file: str
                 ) -> dict[str, Any]:
    """``serve.app.deploy_config``'s document with every secret replaced by the file it is
    read from and each application built by the builders here. Refuses an application it
    does not know (it might carry a secret this function would not move)."""
    apps = []
    for app in config["applications"]:
        path = app["import_path"]
        if path not in _BUILDERS:
            raise ValueError(f"application {app['name']!r}: unknown builder {path!r}")
        args = dict(app["args"])
        tele = {k: v for k, v in args["telemetry"].items() if k != "token"}
        args["telemetry"] = {**tele, "token_file": token_file}
        if path == "serve.app:ingress_app":
            args.pop("api_keys", None)
            args["api_keys_file"] = api_keys_file
        apps.append({**app, "import_path": _BUILDERS[path], "args": args})
    return {**config, "applications": apps}

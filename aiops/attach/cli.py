"""``aiops attach add|list|remove|check``: serving aiops did not start (docs/attach.md).

Targets added here are kept in ``<data_dir>/attach.json``; the server picks up changes to that
file on its next reading (``attach_interval_s``), no restart needed. Targets in the config file
(``[[attach]]``) are listed but not changed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich import box
from rich.markup import escape
from rich.table import Table

from aiops.attach.ray_serve import RayServe, ServeApp
from aiops.attach.watch import load_managed, save_managed, targets_of, vllm_models
from aiops.cli_common import console, fail, settings_of
from aiops.config import AttachTarget
from aiops.errors import AIOpsError, ConfigError

__all__ = ["app"]

app = typer.Typer(help="Observe and act on serving aiops did not start: a Ray cluster (its "
                  "Serve applications) or a vLLM server.", no_args_is_help=True)


def _deployments(serve_app: ServeApp) -> Table:
    """One application's deployments, each with its status and running replicas under its
    name. Service and version are what incidents, the policy and chat-ops name, to be copied
    whole: they never wrap nor shorten (the deployment's column folds first)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True, header_style="bold")
    table.add_column("deployment", overflow="fold")
    table.add_column("service", no_wrap=True)
    table.add_column("version", no_wrap=True)
    for d in serve_app.deployments:
        running = f"{len(d.replicas)} replica{'' if len(d.replicas) == 1 else 's'}"
        table.add_row(f"{escape(d.name)}\n[dim]{escape(d.status)}, {running}[/]",
                      escape(serve_app.service_of(d.name)),
                      escape(serve_app.version_of(d.name)))
    if not serve_app.deployments:
        table.add_row("[dim]none[/]", escape(serve_app.service),
                      escape(serve_app.version))
    return table


def _check(target: AttachTarget) -> None:
    """Read the target now and print what aiops sees there: one block per application (its
    name and status), then its deployments."""
    if target.kind == "ray":
        with RayServe(target) as rest:
            apps = rest.applications()
        console.print(f"[bold]{escape(target.name)}[/]: Serve applications"
                      + ("" if apps else ": none"))
        for a in apps:
            console.print(f"\napplication [bold]{escape(a.name)}[/] {escape(a.status)}")
            console.print(_deployments(a))
        imperative = [a.name for a in apps if a.config is None]
        if imperative:
            console.print(f"[yellow]note:[/] {escape(', '.join(imperative))} deployed with "
                          "serve.run: observed, but aiops cannot re-apply their config")
    else:
        models = ", ".join(vllm_models(target)) or "-"
        console.print(f"{escape(target.name)}: vLLM serving {escape(models)}")


@app.command("add")
def add(ctx: typer.Context,
        kind: Annotated[str, typer.Argument(help="ray or vllm.")],
        name: Annotated[str, typer.Argument(help="A name for it, e.g. prod-ray.")],
        url: Annotated[str, typer.Argument(help="Ray: the dashboard (http://head:8265); "
                                           "vLLM: the server (http://host:8000).")],
        token_file: Annotated[Path | None, typer.Option(
            help="File with its bearer token (Ray's auth token, a vLLM --api-key).")] = None,
        metrics_url: Annotated[str | None, typer.Option(
            help="Prometheus endpoint to scrape (Ray: --metrics-export-port).")] = None,
        check: Annotated[bool, typer.Option(help="Read the target before keeping it.")] = True,
        ) -> None:
    """Attach a target: checked now, kept in <data_dir>/attach.json."""
    settings = settings_of(ctx)
    try:
        target = AttachTarget(kind=kind, name=name, url=url,
                              token_file=token_file, metrics_url=metrics_url)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise fail(ConfigError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"),
                   2) from exc
    try:
        if any(t.name == name for t in targets_of(settings)):
            raise ConfigError(f"a target named {name} is already attached")
        if check:
            _check(target)
        path = save_managed(settings.data_dir, [*load_managed(settings.data_dir), target])
    except AIOpsError as exc:
        raise fail(exc) from exc
    console.print(f"attached {kind} target {name} ({url}); kept in {path}")


@app.command("list")
def list_targets(ctx: typer.Context) -> None:
    """Attached targets, from the config file and from attach.json."""
    settings = settings_of(ctx)
    try:
        managed = {t.name for t in load_managed(settings.data_dir)}
        targets = targets_of(settings)
    except AIOpsError as exc:
        raise fail(exc) from exc
    table = Table("name", "kind", "url", "metrics", "token file", "from")
    for t in targets:
        table.add_row(t.name, t.kind, t.url, t.metrics_url or "", str(t.token_file or ""),
                      "attach.json" if t.name in managed else "config")
    console.print(table)


@app.command("remove")
def remove(ctx: typer.Context, name: str) -> None:
    """Stop observing a target added with `aiops attach add`."""
    settings = settings_of(ctx)
    try:
        managed = load_managed(settings.data_dir)
        if not any(t.name == name for t in managed):
            where = "the config file" if any(t.name == name for t in settings.attach) \
                else "nothing"
            raise ConfigError(f"{name} is not in attach.json (it is in {where})")
        save_managed(settings.data_dir, [t for t in managed if t.name != name])
    except AIOpsError as exc:
        raise fail(exc) from exc
    console.print(f"removed {name}")


@app.command("check")
def check_targets(ctx: typer.Context,
                  name: Annotated[str | None, typer.Argument(help="Only this one.")] = None,
                  ) -> None:
    """Read every attached target now and show what aiops sees."""
    settings = settings_of(ctx)
    try:
        targets = [t for t in targets_of(settings) if name in (None, t.name)]
        if not targets:
            raise ConfigError(f"no attached target {name}" if name else "nothing attached")
        for t in targets:
            _check(t)
    except AIOpsError as exc:
        raise fail(exc) from exc

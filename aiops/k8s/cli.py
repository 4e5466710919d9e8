"""``aiops k8s render|lint``: a thin shell over ``aiops.k8s.render`` and ``aiops.k8s.lint``
(mounted into the ``aiops`` CLI with ``app.add_typer``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from aiops.errors import AIOpsError

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Kubernetes manifests (KubeRay) and their lint.")
console = Console()
err_console = Console(stderr=True)


@app.command()
def render(
    credentials: Annotated[Path, typer.Option(
        help="Directory of the deployment's credentials (admin token, ingest tokens, OpenAI "
        "API key): generated there by the first render (`aiops credentials init`), reused by "
        "later ones. Keep it, and the output, private.")],
    models: Annotated[Path | None, typer.Option(
        help="Model spec file (default: the packaged one).")] = None,
    image: Annotated[str, typer.Option(help="Image of every aiops container (pinned).")
                     ] = "aiops:0.1.0",
    namespace: Annotated[str, typer.Option(help="Namespace of every object.")] = "aiops",
    worker_cpus: Annotated[int, typer.Option(help="CPUs per Ray worker pod.")] = 4,
    ebpf: Annotated[bool, typer.Option(help="Include the eBPF collector DaemonSet.")] = True,
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """The credentials Secret, the RayService (from the model specs), the aiops server and the
    eBPF DaemonSet as YAML. The output holds secrets (the Secret, the API key in the
    RayService): --out writes it mode 0600."""
    from aiops.k8s.render import RenderOptions, render_yaml
    from serve.specs import DEFAULT_SPECS_FILE

    try:
        text = render_yaml(models or DEFAULT_SPECS_FILE, credentials,
                           RenderOptions(image=image, namespace=namespace,
                                         worker_cpus=worker_cpus, ebpf=ebpf))
    except AIOpsError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    except OSError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    if out is None:
        sys.stdout.write(text)
    else:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file too
        with os.fdopen(fd, "w") as f:
            f.write(text)
        console.print(f"wrote {out} (it holds secrets: mode 0600)")


@app.command()
def lint(
    files: Annotated[list[Path], typer.Argument(help="Manifest files; - reads stdin.")],
    allow_privileged: Annotated[list[str] | None, typer.Option(
        help="Kind/name allowed to run privileged (default: DaemonSet/aiops-ebpf).")] = None,
) -> None:
    """Check probes, resources, pinned images, privilege and the RayService schema; print
    each finding with its path and exit 1 when there is any."""
    import yaml

    from aiops.k8s.lint import DEFAULT_PRIVILEGED
    from aiops.k8s.lint import lint as lint_text

    allowed = frozenset(allow_privileged) if allow_privileged else DEFAULT_PRIVILEGED
    total = 0
    for f in files:
        try:
            text = sys.stdin.read() if str(f) == "-" else f.read_text()
            findings = lint_text(text, allowed)
        except (OSError, yaml.YAMLError) as exc:
            err_console.print(f"[red]error:[/red] {escape(str(f))}: {escape(str(exc))}")
            raise typer.Exit(2) from exc
        for finding in findings:
            typer.echo(f"{f}: {finding}")
        total += len(findings)
    if total:
        err_console.print(f"{total} finding(s)")
        raise typer.Exit(1)
    console.print("no findings")

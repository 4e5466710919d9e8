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
    credentials: Annotated[Path | None, typer.Option(
        help="Directory of the deployment's credentials (admin token, ingest tokens, OpenAI "
        "API key): generated there by the first render (`aiops credentials init`), reused by "
        "later ones, and rendered as the Secret aiops-credentials. Keep it, and the output, "
        "private. Required unless --no-secret.")] = None,
    secret: Annotated[bool, typer.Option(
        help="Render the Secret aiops-credentials from --credentials; --no-secret leaves it "
        "out (create it yourself, docs/deploy.md) and the output holds no secret.")] = True,
    models: Annotated[Path | None, typer.Option(
        help="Model spec file (default: the packaged one).")] = None,
    image: Annotated[str, typer.Option(help="Image of every aiops container (pinned).")
                     ] = "aiops:0.1.0",
    namespace: Annotated[str, typer.Option(help="Namespace of every object.")] = "aiops",
    worker_cpus: Annotated[int, typer.Option(help="CPUs per Ray worker pod.")] = 4,
    ebpf: Annotated[bool, typer.Option(help="Include the eBPF collector DaemonSet.")] = True,
    ray_auth: Annotated[bool, typer.Option(
        help="Ray token authentication (RayService authOptions; KubeRay 1.5.1 or newer). "
        "--no-ray-auth for older operators: the NetworkPolicies still fence Ray.")] = True,
    kuberay_namespace: Annotated[str | None, typer.Option(
        help="Namespace of the KubeRay operator, the only client the Ray dashboard admits "
        "(default: an operator pod in any namespace).")] = None,
    serve_from: Annotated[list[str] | None, typer.Option(
        help="CIDR allowed to reach the OpenAI endpoints (port 8000), repeatable; default: "
        "every source (the API key guards them).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """The credentials Secret, NetworkPolicies, the RayService (from the model specs), the
    aiops server and the eBPF DaemonSet as YAML. Only the Secret holds secrets (--out writes
    the file mode 0600); with --no-secret nothing does."""
    from aiops.k8s.render import RenderOptions, render_yaml
    from serve.specs import DEFAULT_SPECS_FILE

    if secret and credentials is None:
        err_console.print("[red]error:[/red] --credentials DIR is required to render the "
                          "Secret (or --no-secret, with the Secret created beforehand)")
        raise typer.Exit(2)
    try:
        text = render_yaml(models or DEFAULT_SPECS_FILE, credentials if secret else None,
                           RenderOptions(image=image, namespace=namespace,
                                         worker_cpus=worker_cpus, ebpf=ebpf,
                                         ray_auth=ray_auth,
                                         operator_namespace=kuberay_namespace,
                                         serve_from=tuple(serve_from or ())))
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
        console.print(f"wrote {out}" + (" (it holds the Secret: mode 0600)" if secret else ""))


@app.command()
def lint(
    files: Annotated[list[Path], typer.Argument(help="Manifest files; - reads stdin.")],
    allow_privileged: Annotated[list[str] | None, typer.Option(
        help="Kind/name allowed to run privileged (default: DaemonSet/aiops-ebpf).")] = None,
) -> None:
    """Check probes, resources, pinned images, privilege, the RayService schema, secrets in
    clear and the NetworkPolicies fencing Ray (the files are linted as one set: a policy in
    one fences the pods of another); print each finding with its path and exit 1 when there
    is any."""
    import yaml

    from aiops.k8s.lint import DEFAULT_PRIVILEGED, lint_documents

    allowed = frozenset(allow_privileged) if allow_privileged else DEFAULT_PRIVILEGED
    parsed: list[tuple[Path, list[object]]] = []
    for f in files:
        try:
            text = sys.stdin.read() if str(f) == "-" else f.read_text()
            parsed.append((f, list(yaml.safe_load_all(text))))
        except (OSError, yaml.YAMLError) as exc:
            err_console.print(f"[red]error:[/red] {escape(str(f))}: {escape(str(exc))}")
            raise typer.Exit(2) from exc
    every = [doc for _, docs in parsed for doc in docs]
    total = 0
    for f, docs in parsed:
        findings = lint_documents(docs, allowed, context=every)
        for finding in findings:
            typer.echo(f"{f}: {finding}")
        total += len(findings)
    if total:
        err_console.print(f"{total} finding(s)")
        raise typer.Exit(1)
    console.print("no findings")

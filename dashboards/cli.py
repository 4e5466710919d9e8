"""``aiops dashboards generate|check|push``: a thin shell over ``dashboards.generate`` and
``dashboards.push`` (mounted into the ``aiops`` CLI with ``app.add_typer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from aiops.errors import AIOpsError
from dashboards.datasources import DEFAULT_PROMETHEUS_URL, DEFAULT_SERVER_URL

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Grafana dashboards as code.")
console = Console()
err_console = Console(stderr=True)

ModelsOption = Annotated[Path | None, typer.Option(
    "--models", help="Model spec file for the SLO objectives (default: the packaged one).")]
PrometheusOption = Annotated[str, typer.Option(
    "--prometheus-url", help="Prometheus URL as Grafana reaches it.")]
ServerOption = Annotated[str, typer.Option(
    "--server-url", help="aiops server URL as Grafana reaches it.")]
ServerCaOption = Annotated[Path | None, typer.Option(
    "--server-ca", exists=True, dir_okay=False, readable=True,
    help="PEM CA of an https aiops server (AIOPS_SERVER_TLS_CA), for Grafana to verify it.")]


def _fail(exc: AIOpsError, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(str(exc))}")
    return typer.Exit(code)


def _render(models: Path | None, prometheus_url: str, server_url: str,
            server_ca: Path | None = None, every_server: bool = False) -> dict[str, str]:
    from dashboards.generate import render

    try:
        return render(models, prometheus_url, server_url, _pem(server_ca), every_server)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc


def _pem(path: Path | None) -> str | None:
    return path.read_text() if path is not None else None


@app.command()
def generate(
    models: ModelsOption = None,
    prometheus_url: PrometheusOption = DEFAULT_PROMETHEUS_URL,
    server_url: ServerOption = DEFAULT_SERVER_URL,
    server_ca: ServerCaOption = None,
    out: Annotated[Path | None, typer.Option(
        help="Directory for generated/ and provisioning/ (default: the dashboards package, "
             "whose files are committed).")] = None,
    all_servers: Annotated[bool, typer.Option(
        "--all-servers", help="Panels read every server's rows (`<table>_all`: with "
        "storage_backend=ducklake, the lake's), not this server's; needs --out.")] = False,
) -> None:
    """Write the dashboards' JSON and Grafana's provisioning files."""
    from dashboards.generate import PACKAGE_DIR, write

    if server_ca is not None and out is None:
        # The package's files are committed: a CA there is one deployment's secret.
        raise _fail(AIOpsError("--server-ca embeds a deployment's CA: write with --out DIR, "
                               "not into the committed package files"), 2)
    if all_servers and out is None:
        raise _fail(AIOpsError("--all-servers writes a deployment's variant: write with "
                               "--out DIR, not into the committed package files"), 2)
    files = _render(models, prometheus_url, server_url, server_ca, all_servers)
    for path in write(out or PACKAGE_DIR, files):
        console.print(str(path))


@app.command()
def check(models: ModelsOption = None) -> None:
    """Exit 1 when the committed files differ from what `generate` would write."""
    from dashboards.generate import PACKAGE_DIR

    stale = [rel for rel, text in _render(models, DEFAULT_PROMETHEUS_URL,
                                          DEFAULT_SERVER_URL).items()
             if not (PACKAGE_DIR / rel).is_file() or (PACKAGE_DIR / rel).read_text() != text]
    if stale:
        err_console.print("stale, run `aiops dashboards generate`: " + ", ".join(stale))
        raise typer.Exit(1)
    console.print("dashboards are current")


@app.command()
def push(
    url: Annotated[str, typer.Option(help="Grafana URL, e.g. http://localhost:3000.")],
    token: Annotated[str | None, typer.Option(
        envvar="GRAFANA_TOKEN", help="Service-account token (else credentials in the URL).")
    ] = None,
    models: ModelsOption = None,
    datasources: Annotated[bool, typer.Option(
        help="Also create or update the Prometheus and aiops API datasources.")] = True,
    prometheus_url: PrometheusOption = DEFAULT_PROMETHEUS_URL,
    server_url: ServerOption = DEFAULT_SERVER_URL,
    server_ca: ServerCaOption = None,
    server_token: Annotated[str | None, typer.Option(
        envvar="AIOPS_GRAFANA_SERVER_TOKEN",
        help="Viewer token the API datasource sends the aiops server (needed beyond "
        "loopback; make one with `aiops token add grafana --role viewer`).")] = None,
) -> None:
    """Upload the dashboards (and datasources) to a running Grafana."""
    from dashboards.generate import GENERATED
    from dashboards.push import push as push_dashboards

    if server_ca is not None and not datasources:
        raise _fail(AIOpsError("--server-ca goes into the API datasource: it needs "
                               "--datasources"), 2)
    files = _render(models, prometheus_url, server_url)
    boards = {rel.removeprefix(f"{GENERATED}/"): text for rel, text in files.items()
              if rel.startswith(f"{GENERATED}/")}
    try:
        report = push_dashboards(url, token, boards,
                                 (prometheus_url, server_url) if datasources else None,
                                 progress=console.log, server_ca=_pem(server_ca),
                                 server_token=server_token)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    console.print(f"pushed {len(report.dashboards)} dashboard(s) and "
                  f"{len(report.datasources)} datasource(s) to {url}")

"""``aiops sdk ...``: a model's OpenAPI document, and the typed Python client generated from it
(docs/models.md, "Client SDK")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from aiops.cli_common import console, fail, settings_of
from aiops.errors import AIOpsError

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Client SDKs generated from a model's schemas.")

Url = Annotated[str | None, typer.Option(
    help="Serve endpoint to fetch the document from (default: the configured stack's).")]
Spec = Annotated[Path | None, typer.Option(
    "--spec", help="Build the document from this spec file instead (no stack needed).")]
Version = Annotated[str | None, typer.Option(
    help="Model version (default: the one taking the most traffic).")]
ApiKey = Annotated[str | None, typer.Option(
    help="API key to fetch with (default: the first of AIOPS_API_KEYS).")]


def _document(ctx: typer.Context, model: str, url: str | None, spec: Path | None,
              version: str | None, api_key: str | None) -> bytes:
    from aiops.sdk import fetch_document, offline_document

    settings = settings_of(ctx)
    try:
        if spec is not None:
            return offline_document(spec, model, version)
        keys = [k.strip() for k in settings.api_keys.split(",") if k.strip()]
        return fetch_document(url or settings.serve_url, model,
                              api_key or (keys[0] if keys else None), version)
    except AIOpsError as exc:
        raise fail(exc) from exc


@app.command("openapi")
def openapi(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Model name.")],
    url: Url = None, spec: Spec = None, version: Version = None, api_key: ApiKey = None,
) -> None:
    """Print a model's OpenAPI document (what `GET /v1/models/MODEL/openapi.json` answers)."""
    typer.echo(_document(ctx, model, url, spec, version, api_key).decode())


@app.command("generate")
def generate(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Model name.")],
    out: Annotated[Path | None, typer.Option(
        help="Package directory to write (default: ./aiops-client-MODEL).")] = None,
    package: Annotated[str | None, typer.Option(
        help="Import name (default: aiops_client_MODEL).")] = None,
    url: Url = None, spec: Spec = None, version: Version = None, api_key: ApiKey = None,
    force: Annotated[bool, typer.Option(
        help="Replace --out even if `aiops sdk generate` did not write it.")] = False,
) -> None:
    """Generate a typed Python client package for MODEL from its OpenAPI document (pydantic
    models by datamodel-code-generator); install it with `pip install DIR`. Exit 1 when the
    model is unknown, the stack unreachable or the generator fails."""
    from aiops.sdk import generate_package, package_name

    document = _document(ctx, model, url, spec, version, api_key)
    target = out or Path(package_name(model).replace("_", "-"))
    try:
        made = generate_package(document, target, package, force=force)
    except AIOpsError as exc:
        raise fail(exc) from exc
    console.print(f"generated {escape(made.package)} for {escape(made.model)} "
                  f"{escape(made.version)} ({made.digest[:19]}) in {escape(str(made.path))}: "
                  f"{', '.join(made.operations)}\n  install: pip install {escape(str(made.path))}")

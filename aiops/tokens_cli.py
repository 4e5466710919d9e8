"""``aiops token add|list|revoke``: scoped bearer tokens of the server (see aiops.auth).

A token is shown once, when it is made; the server keeps only its sha256 in
``<data_dir>/tokens.json`` and notices changes to that file without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from aiops.auth import TOKENS_FILE, AuthError, Role, TokenStore
from aiops.cli_common import console
from aiops.config import Settings

__all__ = ["app"]

app = typer.Typer(help="Scoped bearer tokens: viewer, operator, admin, or ingest (OTLP only).",
                  no_args_is_help=True)


def _store(ctx: typer.Context) -> TokenStore:
    settings: Settings = ctx.obj
    return TokenStore(Path(settings.data_dir) / TOKENS_FILE)


@app.command("add")
def add(ctx: typer.Context,
        name: Annotated[str, typer.Argument(help="Who holds it, e.g. grafana.")],
        role: Annotated[str, typer.Option(help="viewer, operator, admin or ingest.")] = "viewer",
        service: Annotated[list[str] | None, typer.Option(
            help="Ingest only: a service.name (glob) its rows may carry; repeat for more. "
            "Rows as any other service are left out.")] = None,
        ) -> None:
    """Make a token and print it (only now: it is stored hashed)."""
    try:
        parsed = None if role.strip().lower() == "ingest" else Role.parse(role)
        token = _store(ctx).add(name, parsed, services=tuple(service or ()))
    except (ValueError, AuthError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    print(token)


@app.command("list")
def list_tokens(ctx: typer.Context) -> None:
    """Names, roles and creation times (never the tokens)."""
    table = Table("name", "role", "provenance", "services", "created")
    try:
        entries = _store(ctx).entries()
    except AuthError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    for e in entries:
        table.add_row(str(e.get("name")), str(e.get("role") or "ingest"),
                      "yes" if e.get("provenance") else "",
                      ", ".join(map(str, e.get("services") or [])) or "any",
                      str(e.get("created", "")))
    console.print(table)


@app.command("revoke")
def revoke(ctx: typer.Context, name: str) -> None:
    """Remove a token; the server refuses it from its next request."""
    if not _store(ctx).revoke(name):
        console.print(f"[red]error:[/] no token called {name!r}")
        raise typer.Exit(1)
    console.print(f"revoked {name}")

"""What every ``aiops`` command module shares: the consoles, the settings the root callback
read, and the one way a command fails (a one-line message on stderr, an exit code)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from aiops.config import Settings
from aiops.errors import AIOpsError

__all__ = ["console", "err_console", "fail", "settings_of"]

console = Console()
err_console = Console(stderr=True)


def settings_of(ctx: typer.Context) -> Settings:
    """The settings the root command read once (``aiops --config ...``)."""
    settings: Settings = ctx.obj
    return settings


def fail(exc: AIOpsError, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(str(exc))}")
    return typer.Exit(code)

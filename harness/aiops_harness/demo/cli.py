"""``aiops demo``: the demo's command. Harness, not runtime: ``aiops.cli`` imports this module
only when ``demo`` is invoked (or listed by ``aiops --help``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiops.cli_common import console, fail, settings_of
from aiops.errors import AIOpsError

__all__ = ["app", "demo"]

app = typer.Typer(add_completion=False)


@app.command("demo")
def demo(
    ctx: typer.Context,
    scenario: Annotated[str, typer.Option(help="canary (default), error-burst, crash, cpu, "
                                               "memory, all (those five), or node-loss "
                                               "(starts a worker node)")] = "canary",
    report_dir: Annotated[Path, typer.Option(help="Where the report goes.")] = Path("reports"),
    headless: Annotated[bool, typer.Option(help="Plain log lines instead of the live view.")]
    = False,
    rate_scale: Annotated[float, typer.Option(
        min=0.1, max=4.0, help="The traffic mix at this times its arrival rates (on 2 cores "
        "node-loss wants about 0.67: docs/multinode.md).")] = 1.0,
) -> None:
    """Start the embedded stack, drive mixed traffic, break something, and watch detection,
    root cause, the action under policy, verification and the chat-ops answer; write a
    report; stop everything."""
    from aiops_harness.demo.runner import demo_settings, run_demo
    from aiops_harness.demo.scenarios import ORDER
    from aiops_harness.demo.traffic import DEFAULT_WORKLOADS, scaled

    names = list(ORDER) if scenario == "all" else [s.strip() for s in scenario.split(",")]
    try:
        results = run_demo(demo_settings(settings_of(ctx)), console, names, report_dir,
                           headless or not console.is_terminal,
                           scaled(DEFAULT_WORKLOADS, rate_scale))
    except AIOpsError as exc:
        raise fail(exc) from exc
    # Done means every scenario was detected, attributed to the right version and fault class,
    # and recovered.
    if not all(r.incident and r.attributed and r.recovered_at and not r.problems
               for r in results):
        raise typer.Exit(1)

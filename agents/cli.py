"""``aiops ask``: chat-ops in the terminal (``aiops eval``, the agent's evaluation, is harness:
``aiops_harness.agent_evals.cli``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from aiops.config import Settings
from aiops.errors import AIOpsError

__all__ = ["ask", "render"]

console = Console()
err_console = Console(stderr=True)


def ask(
    ctx: typer.Context,
    question: Annotated[str, typer.Argument(help="e.g. 'what happened to smollm2-135m-instruct "
                                                 "in the last 15 minutes?'")],
    user: Annotated[str, typer.Option(help="Who asks (recorded with any proposal).")] = "cli",
    as_json: Annotated[bool, typer.Option("--json", help="The whole answer as JSON.")] = False,
) -> None:
    """Ask the agent about the running stack (incidents, causes, evidence; it may propose
    actions, which the remediation policy decides)."""
    from aiops.client import ServerClient

    settings: Settings = ctx.obj
    if not question.strip():
        err_console.print("[red]error:[/red] the question is empty")
        raise typer.Exit(2)
    try:
        # AIOPS_TOKEN, else the admin token where this machine has it, else none (may ask,
        # not act): the client's own token, never the admin token behind AIOPS_TOKEN's back.
        with ServerClient.of(settings) as client:
            answer = client.ask(question, user)
    except AIOpsError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    render(answer)


def render(a: dict[str, Any], out: Console = console) -> None:
    """An answer (``Answer`` as JSON) for the terminal."""
    from agents.agent import proposal_text
    from agents.tools import ToolResult

    f = a.get("facts")
    title = "answer"
    if f:
        title = (f"{f['fault_class'] or 'anomaly'} on {f['component']}"
                 + (f"@{f['version']}" if f.get("version") else "")
                 + f" - {f['incident_id']} ({f['status']})")
    n = a["narrative"]
    report = a.get("report")
    if report:
        # A question about the telemetry: its figures, what could not be answered, the SQL.
        title = report["headline"]
        lines = list(report["lines"]) + ([
            "Not answered from the telemetry here: " + "; ".join(report["gaps"]) + "."]
            if report["gaps"] else [])
        body = escape("\n".join(lines))
    elif a["intent"]["kind"] == "list_incidents":
        body = escape(a["text"])
    else:
        body = escape(n["text"])
    note = f"narrative: {n['source']}" + (f" (LLM's rejected: {n['rejected']})"
                                          if n.get("rejected") else "")
    out.print(Panel(body, title=escape(title), subtitle=escape(note)))
    if report:
        for q in report["queries"]:
            out.print(Syntax(q["sql"], "sql", word_wrap=True))
    if f:
        facts = Table.grid(padding=(0, 2))
        for key in ("component", "version", "replica", "fault_class", "onset", "severity",
                    "confidence"):
            if f.get(key) is not None:
                value = f"{f[key]:.0%}" if key == "confidence" else str(f[key])
                facts.add_row(f"[bold]{key}[/bold]", escape(value))
        out.print(facts)
    if a.get("evidence"):
        t = Table("tag", "kind", "id", "what", title="evidence")
        for e in a["evidence"]:
            t.add_row(e["tag"], e["kind"], escape(e["id"]), escape(e["text"]))
        out.print(t)
    p = a.get("proposal")
    if p:
        # The same words as the answer's text: done, waiting for whom, denied or impossible
        # and why - never a bare status.
        out.print(escape(proposal_text(ToolResult.model_validate(p))))

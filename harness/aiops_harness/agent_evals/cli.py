"""``aiops eval``: the agent's evaluation over the incident fixtures and the telemetry
questions. Harness, not runtime: ``aiops.cli`` imports this module only when ``eval`` is
invoked (or listed by ``aiops --help``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from agents.cli import console, err_console
from aiops.config import Settings
from aiops.errors import AIOpsError

__all__ = ["app", "evaluate"]

app = typer.Typer(add_completion=False)


def spread(cases: list[Any], n: int) -> list[Any]:
    """Up to ``n`` cases taking each family (a case's first tag) in turn, in fixture order."""
    families: dict[str, list[Any]] = {}
    for c in cases:
        families.setdefault(c.tags[0] if c.tags else "", []).append(c)
    picked: list[Any] = []
    while len(picked) < min(n, len(cases)):
        for group in families.values():
            if group and len(picked) < n:
                picked.append(group.pop(0))
    return sorted(picked, key=cases.index)


@app.command("eval")
def evaluate(
    ctx: typer.Context,
    llm: Annotated[str, typer.Option(help="The narrative's LLM: `none`, `stack` (the running "
                                          "stack's Serve endpoint) or an OpenAI-compatible "
                                          "base URL.")] = "none",
    model: Annotated[str | None, typer.Option(help="Model name at that endpoint "
                                                   "(default: AIOPS_AGENT_LLM_MODEL).")] = None,
    only: Annotated[str | None, typer.Option(help="Only cases whose name contains this.")]
    = None,
    cases_dir: Annotated[Path | None, typer.Option(help="Fixture folder (default: the "
                                                        "packaged cases).")] = None,
    sample: Annotated[int | None, typer.Option(
        min=1, help="At most this many cases, spread over the scenario families (one of "
                    "each family first, in fixture order).")] = None,
    min_pass: Annotated[float, typer.Option(help="Exit 1 below this pass rate (0-1).")] = 0.0,
    questions: Annotated[bool, typer.Option(help="Also ask the telemetry questions "
                                                 "(aiops_harness/agent_evals/questions.yaml) "
                                                 "of the fixtures' stores.")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Replay the incident fixtures through the analyzer and the agent; print the pass rate
    without and (with an LLM) with the LLM's narrative; then the telemetry questions' pass
    rate (figures checked against a reference computed from the fixtures' raw rows)."""
    from agents.agent import make_llm
    from aiops_harness.agent_evals.cases import CASES_DIR, load_cases
    from aiops_harness.agent_evals.run import CaseResult, run_eval

    settings: Settings = ctx.obj
    try:
        cases = load_cases(cases_dir or CASES_DIR, only)
    except (AIOpsError, OSError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    if not cases:
        err_console.print("[red]error:[/red] no eval cases matched")
        raise typer.Exit(2)
    if sample is not None:
        cases = spread(cases, sample)
    base = {"none": None, "stack": f"{settings.serve_url}/v1"}.get(llm, llm)
    if base is not None and not base.startswith(("http://", "https://")):
        err_console.print(f"[red]error:[/red] --llm must be none, stack or an http(s) URL, "
                          f"not {llm!r}")
        raise typer.Exit(2)
    name = model or settings.agent_llm_model
    key = settings.agent_llm_api_key or next(
        (k.strip() for k in settings.api_keys.split(",") if k.strip()), "none")
    client = make_llm(base, name, key, settings.agent_timeout_s,
                      priority=settings.agent_llm_priority) if base else None

    def progress(r: CaseResult) -> None:
        mark = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
        failed = ", ".join(k for k, ok in r.checks.items() if not ok)
        narr = "" if r.narrative_ok is None else \
            (" narrative ok" if r.narrative_ok else f" narrative rejected: {r.narrative_problem}")
        # With --json, progress goes to stderr: stdout stays one JSON document.
        (err_console if as_json else console).print(
            f"{mark} {r.case} ({r.seconds:.1f} s){' - ' + failed if failed else ''}"
            f"{escape(narr)}")

    report = run_eval(cases, client, name if base else None, progress)
    with_llm = report.pass_rate_with_narrative
    asked = _questions(cases_dir, only, as_json) if questions else None
    if as_json:
        typer.echo(json.dumps({
            "cases": len(report.results), "pass_rate": report.pass_rate,
            "pass_rate_with_narrative": with_llm, "llm": report.llm,
            "results": [{"case": r.case, "tags": r.tags, "checks": r.checks,
                         "narrative_source": r.narrative_source,
                         "narrative_ok": r.narrative_ok, "problem": r.narrative_problem,
                         "seconds": r.seconds} for r in report.results],
            "questions": asked}, indent=2))
    else:
        console.print(f"\n[bold]{len(report.results)} cases: facts pass rate "
                      f"{report.pass_rate:.1%}[/bold] (deterministic plan)")
        if with_llm is not None:
            console.print(f"[bold]with the LLM narrative ({escape(name)}): "
                          f"{with_llm:.1%}[/bold]")
        if asked is not None:
            kinds = ", ".join(f"{k} {v['passed']}/{v['total']}"
                              for k, v in asked["by_kind"].items())
            console.print(f"[bold]{asked['total']} telemetry questions: facts pass rate "
                          f"{asked['pass_rate']:.1%}[/bold] ({kinds})")
    if report.pass_rate < min_pass or (asked is not None and asked["pass_rate"] < min_pass):
        raise typer.Exit(1)


def _questions(cases_dir: Path | None, only: str | None, as_json: bool) -> dict[str, Any]:
    """Ask the telemetry questions; their pass rate overall and per kind."""
    from aiops_harness.agent_evals.cases import CASES_DIR
    from aiops_harness.agent_evals.questions import QuestionResult, load_questions, run_questions

    def progress(r: QuestionResult) -> None:
        mark = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
        failed = ", ".join(k for k, ok in r.checks.items() if not ok)
        detail = f" - {failed}: {'; '.join(r.why)}" if failed else ""
        (err_console if as_json else console).print(
            f"{mark} {r.kind} {escape(r.question)} ({r.case}){escape(detail)}")

    chosen = [q for q in load_questions() if only is None or only in q.case]
    results = run_questions(chosen, cases_dir or CASES_DIR, progress)
    by_kind: dict[str, dict[str, int]] = {}
    for r in results:
        k = by_kind.setdefault(r.kind, {"passed": 0, "total": 0})
        k["total"] += 1
        k["passed"] += r.passed
    return {"total": len(results), "passed": sum(r.passed for r in results),
            "pass_rate": sum(r.passed for r in results) / max(len(results), 1),
            "by_kind": by_kind,
            "results": [{"case": r.case, "question": r.question, "kind": r.kind,
                         "checks": r.checks, "why": r.why, "seconds": r.seconds}
                        for r in results]}

"""``aiops models ...``: check model specs, and the model lifecycle on the running stack
(apply, status, canary, traffic, promote, rollback, rollout, faults)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from aiops.cli_common import console, fail, settings_of
from aiops.control_status import ControlStatus, ModelStatus
from aiops.errors import AIOpsError

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Model specs.")
models_app = app
_settings, _fail = settings_of, fail



@models_app.command("check")
def models_check(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(help="Spec file (default: configured).")] = None,
) -> None:
    """Validate a model spec file and list what it would serve. Exit 2 when invalid."""
    from serve.specs import DEFAULT_SPECS_FILE, load_specs

    file = path or _settings(ctx).models_file or DEFAULT_SPECS_FILE
    try:
        specs = load_specs(file)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc
    t = Table("model", "version", "type", "backend", "replicas", "cpus", "priority",
              title=str(file))
    for s in specs:
        t.add_row(s.name, s.version, s.model_type.value, s.backend,
                  f"{s.autoscaling.min_replicas}-{s.autoscaling.max_replicas}",
                  f"{s.resources.num_cpus:g}", s.qos.priority.value)
    console.print(t)


def _lifecycle(ctx: typer.Context) -> Any:
    from aiops.lifecycle import LifecycleClient

    try:
        return LifecycleClient.from_settings(_settings(ctx))
    except AIOpsError as exc:
        raise _fail(exc) from exc


def _print_model(name: str, answer: ModelStatus | dict[str, Any]) -> None:
    """One model's versions: from the status, or an operation's answer (the model's status
    after it)."""
    try:
        model = answer if isinstance(answer, ModelStatus) else \
            ModelStatus.parse(answer, "the control plane")
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("version", "weight %", "backend", "digest", "faults",
              title=f"{name} (stable: {model.stable})")
    for v in model.versions:
        t.add_row(v.version, str(v.weight), v.backend or "", (v.digest or "")[:19],
                  json.dumps(v.faults) if v.faults else "")
    console.print(t)


def _run_lifecycle(ctx: typer.Context, op: str, *args: Any) -> Any:
    """The client's answer to ``op``: a ``ControlStatus`` for status, else a JSON object."""
    client = _lifecycle(ctx)
    try:
        return getattr(client, op)(*args)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()


@models_app.command("apply")
def models_apply(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Model spec file.")],
) -> None:
    """Hot-reload a spec file into the running stack: validated first, then only what changed
    is redeployed (new or changed versions pass their gates before taking traffic)."""
    from serve.specs import load_specs

    try:
        specs = load_specs(path)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc
    out = _run_lifecycle(ctx, "apply", [s.model_dump(mode="json") for s in specs])
    for kind in ("added", "changed", "removed"):
        if out[kind]:
            console.print(f"{kind}: {', '.join(out[kind])}")
    if not any(out.values()):
        console.print("nothing changed")


@models_app.command("status")
def models_status(ctx: typer.Context) -> None:
    """Versions, traffic weights, digests and faults of every model in the running stack."""
    status: ControlStatus = _run_lifecycle(ctx, "status")
    for name, model in status.models.items():
        _print_model(name, model)


@models_app.command("canary")
def models_canary(
    ctx: typer.Context, model: str, version: str,
    percent: Annotated[int, typer.Option(min=0, max=100, help="Share for the canary.")] = 5,
) -> None:
    """Send PERCENT of MODEL's traffic to VERSION, the rest to its stable version."""
    _print_model(model, _run_lifecycle(ctx, "canary", model, version, percent))


@models_app.command("traffic")
def models_traffic(
    ctx: typer.Context, model: str,
    weights: Annotated[list[str], typer.Argument(help="VERSION=PERCENT ..., adding to 100.")],
) -> None:
    """Set the traffic split of MODEL explicitly, e.g. `v1=90 v2=10`."""
    try:
        parsed = {w.split("=", 1)[0]: int(w.split("=", 1)[1]) for w in weights}
    except (IndexError, ValueError) as exc:
        raise _fail(AIOpsError(f"weights look like v1=90 v2=10, got {weights}"), 2) from exc
    _print_model(model, _run_lifecycle(ctx, "set_traffic", model, parsed))


@models_app.command("promote")
def models_promote(ctx: typer.Context, model: str, version: str) -> None:
    """Give VERSION all of MODEL's traffic and make it the stable version."""
    _print_model(model, _run_lifecycle(ctx, "promote", model, version))


@models_app.command("rollback")
def models_rollback(ctx: typer.Context, model: str) -> None:
    """Give MODEL's stable version all of its traffic again."""
    _print_model(model, _run_lifecycle(ctx, "rollback", model))


@models_app.command("rollout")
def models_rollout(
    ctx: typer.Context, model: str, version: str,
    steps: Annotated[str, typer.Option(help="Canary percentages, rising to 100.")]
    = "5,25,50,100",
    step_s: Annotated[float, typer.Option(help="Seconds each step is observed.")] = 60.0,
    wait: Annotated[bool, typer.Option(help="Follow it until it ends.")] = True,
) -> None:
    """Progressive canary of an applied VERSION: each step's SLIs against the stable
    version's; promoted at the end, or rolled back (under the policy) on a breach."""
    import time

    from aiops.client import ServerClient

    settings = _settings(ctx)
    try:
        parsed = [int(p) for p in steps.split(",")]
    except ValueError as exc:
        raise _fail(AIOpsError(f"--steps looks like 5,25,50,100, got {steps!r}"), 2) from exc
    try:
        with ServerClient.of(settings) as client:
            state = client.rollout(model, version, steps=parsed, step_s=step_s)
            console.print(f"{state['rollout_id']}: {model} {version} vs {state['stable']}, "
                          f"steps {state['steps']}")
            seen = 0
            while wait and state["status"] in ("pending", "running"):
                time.sleep(1)
                state = client.rollouts(state["rollout_id"])
                for h in state["history"][seen:]:
                    mark = "[green]pass[/green]" if h["ok"] else "[red]breach[/red]"
                    console.print(f"  {h['percent']:>3}% {mark} {escape(h['reason'])}")
                seen = len(state["history"])
    except AIOpsError as exc:
        raise _fail(exc) from exc
    console.print(f"{state['rollout_id']}: [bold]{state['status']}[/bold]")
    if state["status"] in ("failed", "halted", "rolled_back"):
        raise typer.Exit(1)


@models_app.command("faults")
def models_faults(
    ctx: typer.Context, model: str, version: str,
    latency_ms: Annotated[float, typer.Option(help="Added latency per request.")] = 0,
    error_rate: Annotated[float, typer.Option(help="Share of requests that fail.")] = 0,
    cpu_burn_ms: Annotated[float, typer.Option(help="Busy CPU per request.")] = 0,
    memory_growth_mb: Annotated[float, typer.Option(help="Memory leaked per request.")] = 0,
    crash_after: Annotated[int, typer.Option(help="Replica exits after N requests.")] = 0,
    slow_tokens_ms: Annotated[float, typer.Option(help="Added per streamed token.")] = 0,
) -> None:
    """Inject faults into one model version (all zero clears them)."""
    faults = {"latency_ms": latency_ms, "error_rate": error_rate, "cpu_burn_ms": cpu_burn_ms,
              "memory_growth_mb": memory_growth_mb, "crash_after": crash_after,
              "slow_tokens_ms": slow_tokens_ms}
    _print_model(model, _run_lifecycle(ctx, "set_faults", model, version, faults))

"""The ``aiops`` command line: a thin shell over the service functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aiops.bench.cli import app as bench_app
from aiops.config import Settings, load_settings, settings_reference
from aiops.errors import AIOpsError
from aiops.schema import schema_reference
from aiops.tokens_cli import app as token_app

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Observability and AIOps for AI model serving.")
config_app = typer.Typer(no_args_is_help=True, help="Show or document the configuration.")
app.add_typer(config_app, name="config")
app.add_typer(token_app, name="token")
app.add_typer(bench_app, name="bench")

def _mount_optional() -> None:
    """Commands whose modules live beside the core (the agent, dashboards as code,
    Kubernetes)."""
    from agents.cli import ask, evaluate
    from aiops.credentials import app as credentials_app
    from aiops.k8s.cli import app as k8s_app
    from dashboards.cli import app as dashboards_app

    app.command("ask")(ask)
    app.command("eval")(evaluate)
    app.add_typer(dashboards_app, name="dashboards")
    app.add_typer(k8s_app, name="k8s")
    app.add_typer(credentials_app, name="credentials")


_mount_optional()

console = Console()
err_console = Console(stderr=True)


def _settings(ctx: typer.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


def _fail(exc: AIOpsError, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(str(exc))}")
    return typer.Exit(code)


@app.callback()
def main(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="TOML configuration file (else $AIOPS_CONFIG).")] = None,
) -> None:
    try:
        ctx.obj = load_settings(config)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc


@app.command()
def server(ctx: typer.Context) -> None:
    """Run the aiops server (OTLP receiver, SQL API, /metrics) in the foreground."""
    import uvicorn

    from aiops.auth import ADMIN_TOKEN_FILE, ensure_secret
    from aiops.logs import configure_json_logging
    from aiops.server.app import create_app
    from aiops.server.limits import limit_memory
    from aiops.store import Store
    from aiops.tls import server_ssl_options

    settings = _settings(ctx)
    configure_json_logging(settings.log_level)
    try:
        ssl_options = server_ssl_options(settings)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc
    limit_memory(settings.server_memory_mb)
    try:
        store = Store(settings.db_path, memory_limit_mb=settings.duckdb_memory_mb)
        if not settings.admin_token:
            ensure_secret(settings.data_dir / ADMIN_TOKEN_FILE)
    except (AIOpsError, OSError) as exc:
        raise _fail(AIOpsError(str(exc))) from exc
    try:
        uvicorn.run(create_app(settings, store), host=settings.server_host,
                    port=settings.server_port, log_level=settings.log_level.lower(),
                    access_log=False, log_config=None,
                    # In-flight requests get 5 s after SIGTERM; then the queries still running
                    # are interrupted as the store closes (a query never holds shutdown).
                    timeout_graceful_shutdown=5, **ssl_options)
    finally:
        store.close()


@app.command()
def up(ctx: typer.Context) -> None:
    """Start the server, a local Ray instance and the Serve application."""
    from aiops import stack

    try:
        stack.up(_settings(ctx), progress=console.log)
    except AIOpsError as exc:
        raise _fail(exc) from exc


@app.command()
def down(ctx: typer.Context) -> None:
    """Stop exactly what `aiops up` started."""
    from aiops import stack

    try:
        n = stack.down(_settings(ctx), progress=console.log)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    console.log(f"stopped {n} component(s)" if n else "nothing was running")


@app.command()
def status(ctx: typer.Context) -> None:
    """Show the components of the stack and whether they answer. Exit 1 if any is down."""
    from aiops import stack

    rows = stack.status(_settings(ctx))
    if not rows:
        console.print("the stack is not running (no state in "
                      f"{_settings(ctx).data_dir}); start it with `aiops up`")
        raise typer.Exit(1)
    t = Table("component", "pid", "running", "healthy", "url", "log")
    for r in rows:
        t.add_row(*(str(r[k]) for k in ("component", "pid", "running", "healthy", "url", "log")))
    console.print(t)
    if not all(r["healthy"] for r in rows):
        raise typer.Exit(1)


@app.command()
def sql(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="One SELECT statement.")],
    limit: Annotated[int | None, typer.Option(help="Most rows to return.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Run a read-only SQL query against the telemetry store (through the server)."""
    from aiops.client import ServerClient

    try:
        with ServerClient.of(_settings(ctx)) as client:
            result = client.sql(query, limit=limit)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(result))
        return
    t = Table(*result["columns"])
    for row in result["rows"]:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)
    if result["truncated"]:
        err_console.print(f"[yellow]truncated to {len(result['rows'])} rows[/yellow]")


incidents_app = typer.Typer(no_args_is_help=False, invoke_without_command=True,
                            help="Incidents the analytics opened (latest state).")
app.add_typer(incidents_app, name="incidents")


@incidents_app.callback()
def incidents(
    ctx: typer.Context,
    status: Annotated[str, typer.Option(help="open, mitigating, resolved, active or all.")]
    = "active",
) -> None:
    """List incidents (`aiops incidents show ID` for one with its evidence)."""
    if ctx.invoked_subcommand is not None:
        return
    from aiops.client import ServerClient

    try:
        with ServerClient.of(_settings(ctx)) as client:
            rows = client.incidents(None if status == "all" else status)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("incident", "opened", "status", "severity", "service", "version", "fault",
              "summary", title=f"incidents ({status})")
    for r in rows:
        t.add_row(r["incident_id"], str(r["opened_at"])[:19], r["status"], r["severity"] or "",
                  r["service"] or "", r["model_version"] or "", r["fault_class"] or "",
                  escape(r["summary"] or ""))
    console.print(t)


@incidents_app.command("show")
def incident_show(ctx: typer.Context, incident_id: str,
                  as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One incident: root causes with confidence and evidence ids, findings, context."""
    from aiops.client import ServerClient

    try:
        with ServerClient.of(_settings(ctx)) as client:
            inc = client.incident(incident_id)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(inc, indent=2))
        return
    console.print(f"[bold]{inc['incident_id']}[/bold] {inc['status']} ({inc['severity']}): "
                  f"{escape(inc['summary'] or '')}")
    t = Table("rank", "entity", "fault", "confidence", "detectors", "evidence")
    for i, c in enumerate(inc["evidence"].get("root_causes", []), 1):
        ids = ", ".join(f"{e['kind']}:{e['id']}" for e in c["evidence"][:4])
        t.add_row(str(i), c["entity"], c["fault_class"], f"{c['confidence']:.0%}",
                  ", ".join(c["detectors"]), escape(ids))
    console.print(t)
    for c in inc["evidence"].get("context", []):
        console.print(f"  context {c['kind']}: {escape(str(c.get('id')))}")


actions_app = typer.Typer(no_args_is_help=False, invoke_without_command=True,
                          help="Remediation actions; approve or deny pending ones.")
app.add_typer(actions_app, name="actions")


@actions_app.callback()
def actions(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only this status (e.g. pending).")] = None,
) -> None:
    """List remediation actions in their latest state."""
    if ctx.invoked_subcommand is not None:
        return
    from aiops.client import ServerClient

    try:
        with ServerClient.of(_settings(ctx)) as client:
            rows = client.actions(status)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("action", "incident", "kind", "target", "mode", "status", "outcome")
    for r in rows:
        t.add_row(r["action_id"], r["incident_id"] or "", r["kind"], r["target"] or "",
                  r["mode"] or "", r["status"] or "", escape(json.dumps(r["outcome"])[:80]))
    console.print(t)


def _decide(ctx: typer.Context, action_id: str, approve: bool, user: str) -> None:
    from aiops.client import ServerClient
    from aiops.lifecycle import admin_token

    settings = _settings(ctx)
    try:
        with ServerClient.of(settings) as client:
            result = client.decide(action_id, approve, admin_token(settings), user)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    console.print(f"{result['action_id']}: {result['status']} ({result['description']})")


@actions_app.command("approve")
def action_approve(ctx: typer.Context, action_id: str,
                   user: Annotated[str, typer.Option(help="Who approves.")] = "cli") -> None:
    """Approve a pending action: it runs now."""
    _decide(ctx, action_id, True, user)


@actions_app.command("deny")
def action_deny(ctx: typer.Context, action_id: str,
                user: Annotated[str, typer.Option(help="Who denies.")] = "cli") -> None:
    """Deny a pending action."""
    _decide(ctx, action_id, False, user)


@app.command()
def demo(
    ctx: typer.Context,
    scenario: Annotated[str, typer.Option(help="canary (default), error-burst, crash, cpu, "
                                               "memory, or all")] = "canary",
    report_dir: Annotated[Path, typer.Option(help="Where the report goes.")] = Path("reports"),
    headless: Annotated[bool, typer.Option(help="Plain log lines instead of the live view.")]
    = False,
) -> None:
    """Start the embedded stack, drive mixed traffic, break something, and watch detection,
    root cause, the action under policy, verification and the chat-ops answer; write a
    report; stop everything."""
    from aiops.demo.runner import demo_settings, run_demo
    from aiops.demo.scenarios import ORDER

    names = list(ORDER) if scenario == "all" else [s.strip() for s in scenario.split(",")]
    try:
        results = run_demo(demo_settings(_settings(ctx)), console, names, report_dir,
                           headless or not console.is_terminal)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    if not all(r.incident and not r.problems for r in results):
        raise typer.Exit(1)


@config_app.command("show")
def config_show(ctx: typer.Context) -> None:
    """Print the effective configuration; secrets (``SECRET_SETTINGS``) show only whether
    they are set."""
    from aiops.config import SECRET_SETTINGS

    shown = json.loads(_settings(ctx).model_dump_json())
    for name in SECRET_SETTINGS & shown.keys():
        if shown[name]:
            shown[name] = "*** (set, redacted)"
    typer.echo(json.dumps(shown, indent=2))


@config_app.command("docs")
def config_docs() -> None:
    """Print docs/configuration.md (generated from the settings class)."""
    typer.echo(settings_reference(), nl=False)


@config_app.command("schema")
def config_schema() -> None:
    """Print docs/schema.md (generated from the telemetry schema)."""
    typer.echo(schema_reference(), nl=False)


ebpf_app = typer.Typer(no_args_is_help=True, help="The eBPF collector (root only).")
app.add_typer(ebpf_app, name="ebpf")


@ebpf_app.command("check")
def ebpf_check(ctx: typer.Context) -> None:
    """Say whether the eBPF collector can run here, and if not exactly why (exit 1)."""
    from collectors.ebpf.collector import kernel_source, preflight

    settings = _settings(ctx)
    problems = preflight(settings.ebpf_kernel_source)
    for p in problems:
        err_console.print(f"[red]cannot run:[/red] {escape(p)}")
    if problems:
        raise typer.Exit(1)
    console.print(f"the eBPF collector can run (kernel headers: "
                  f"{kernel_source(settings.ebpf_kernel_source)})")


@ebpf_app.command("run")
def ebpf_run() -> None:
    """Run the eBPF collector in the foreground (what `aiops up` starts)."""
    from collectors.ebpf.__main__ import main as collector_main

    raise typer.Exit(collector_main())


models_app = typer.Typer(no_args_is_help=True, help="Model specs.")
app.add_typer(models_app, name="models")


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


def _print_model(name: str, model: dict[str, Any]) -> None:
    t = Table("version", "weight %", "backend", "digest", "faults",
              title=f"{name} (stable: {model.get('stable')})")
    for v in model["versions"]:
        t.add_row(v["version"], str(v["weight"]), v["backend"], (v["digest"] or "")[:19],
                  json.dumps(v["faults"]) if v["faults"] else "")
    console.print(t)


def _run_lifecycle(ctx: typer.Context, op: str, *args: Any) -> dict[str, Any]:
    client = _lifecycle(ctx)
    try:
        result: dict[str, Any] = getattr(client, op)(*args)
        return result
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
    for name, model in _run_lifecycle(ctx, "status")["models"].items():
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
    from aiops.lifecycle import admin_token

    settings = _settings(ctx)
    try:
        parsed = [int(p) for p in steps.split(",")]
    except ValueError as exc:
        raise _fail(AIOpsError(f"--steps looks like 5,25,50,100, got {steps!r}"), 2) from exc
    try:
        with ServerClient.of(settings) as client:
            state = client.rollout(model, version, admin_token(settings), parsed, step_s)
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


@app.command()
def keygen(
    directory: Annotated[Path, typer.Argument(help="Where to write NAME.key and NAME.pub.")],
    name: Annotated[str, typer.Option(help="File name stem.")] = "aiops",
) -> None:
    """Create an Ed25519 key pair for signing model packages."""
    from serve.packages import generate_keys

    try:
        private, public = generate_keys(directory, name)
    except (AIOpsError, FileExistsError) as exc:
        raise _fail(AIOpsError(str(exc))) from exc
    console.print(f"private key: {private} (keep it secret)\npublic key:  {public}")


@app.command("pack")
def pack_cmd(
    spec_file: Annotated[Path, typer.Option("--spec", help="Model spec file.")],
    model: Annotated[str, typer.Option(help="Model name in the spec file.")],
    key: Annotated[Path, typer.Option(help="Ed25519 private key (PEM).")],
    out: Annotated[Path, typer.Option(help="Package directory to create.")],
    version: Annotated[str | None, typer.Option(help="Version (default: the only one).")] = None,
    reference: Annotated[bool, typer.Option(help="Record reference outputs.")] = True,
) -> None:
    """Build a signed package: the model's artifact, a manifest of sha256 digests, reference
    outputs computed by running the model here, and an Ed25519 signature."""
    from serve.backends.base import get_backend
    from serve.gates import default_reference_inputs, reference_kind, reference_outputs
    from serve.packages import pack
    from serve.specs import load_specs

    try:
        specs = [s for s in load_specs(spec_file) if s.name == model
                 and (version is None or s.version == version)]
        if len(specs) != 1:
            raise AIOpsError(f"{spec_file} has {len(specs)} matching versions of {model!r}; "
                             "name one with --version")
        spec = specs[0]
        ref: dict[str, Any] | None = None
        n_ref = 0
        if reference:
            kind = reference_kind(spec)
            inputs = default_reference_inputs(kind)
            backend: Any = get_backend(spec.backend)(spec)
            backend.start()
            try:
                outputs = reference_outputs(backend, kind, inputs, 16)
            finally:
                backend.shutdown()
            ref = {"kind": kind, "inputs": inputs, "outputs": outputs, "tolerance": 1e-4,
                   "max_tokens": 16}
            n_ref = len(inputs)
        path = pack(spec.artifact_path(), out, name=spec.name, version=spec.version,
                    backend=spec.backend, private_key=key, reference=ref)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    console.print(f"packed {spec.name}:{spec.version} into {path}"
                  + (f" with {n_ref} reference output(s)" if n_ref else ""))


@app.command("verify")
def verify_cmd(
    package: Annotated[Path, typer.Argument(help="Package directory.")],
    key: Annotated[list[Path], typer.Option(help="Trusted public key(s) (PEM).")],
) -> None:
    """Verify a package's signature and every file's digest. Exit 1 and say why if not."""
    from serve.packages import load_public_keys, verify_package

    try:
        verified = verify_package(package, load_public_keys(key))
    except AIOpsError as exc:
        raise _fail(exc) from exc
    m = verified.manifest
    console.print(f"OK {m['name']}:{m['version']} ({m['backend']}), {len(m['files'])} files, "
                  f"manifest {verified.digest[:23]}")


ledger_app = typer.Typer(no_args_is_help=True, help="Tamper-evident hash chains.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("verify")
def ledger_verify(
    ctx: typer.Context,
    table: Annotated[str, typer.Option(help="Chained table.")] = "provenance",
    offline: Annotated[bool, typer.Option(
        help="Open the DuckDB file directly (the server must be stopped).")] = False,
) -> None:
    """Recompute a hash chain; exit 1 and say where if an entry was modified, deleted,
    inserted or reordered, or the tail was cut off."""
    from aiops.ledger import verify_table

    settings = _settings(ctx)
    try:
        if offline:
            from aiops.store import Store

            store = Store(settings.db_path)
            try:
                report = verify_table(store, table)
            finally:
                store.close()
        else:
            import httpx

            from aiops.tls import client_verify

            try:
                resp = httpx.get(f"{settings.server_url}/api/v1/ledger/{table}/verify",
                                 timeout=300, verify=client_verify(settings))
            except httpx.HTTPError as exc:
                raise AIOpsError(f"cannot reach the aiops server ({exc}); "
                                 "use --offline when it is stopped") from exc
            report = resp.json()
            if resp.status_code != 200:
                raise AIOpsError(report.get("error", resp.text))
    except (AIOpsError, ValueError) as exc:
        raise _fail(AIOpsError(str(exc))) from exc
    if report["ok"]:
        console.print(f"OK: {report['entries']} entries in {table}, chain intact"
                      + ("" if report["anchored"] else " (no anchor file found)"))
        return
    err_console.print(f"[red]TAMPERED[/red]: {table} ({report['entries']} entries)")
    for problem in report["problems"]:
        err_console.print(f"  {escape(problem)}")
    raise typer.Exit(1)

"""The ``aiops`` command line: a thin shell over the service functions."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from aiops.attach.cli import app as attach_app
from aiops.cli_common import console, err_console, fail, settings_of
from aiops.config import load_settings, settings_reference
from aiops.errors import AIOpsError
from aiops.models_cli import app as models_app
from aiops.pack_cli import register as register_pack_commands
from aiops.schema import schema_reference
from aiops.sdk_cli import app as sdk_app
from aiops.tokens_cli import app as token_app

__all__ = ["HARNESS", "HARNESS_GROUP", "app"]

# The harness (the agent's evaluation, the demo, the benchmarks) is a distribution of its own
# (harness/ in the repository): where it is installed, its entry points (group
# ``aiops.harness``) name each command's module, whose ``app`` holds the command. In ``aiops
# --help`` each follows the runtime command given here (a command of an unknown name goes last).
HARNESS_GROUP = "aiops.harness"
_AFTER = {"eval": "ask", "demo": "sql", "bench": "token"}


def _harness_modules() -> dict[str, tuple[str, str]]:
    """name -> (module, the command it follows) of the installed harness's commands."""
    return {e.name: (e.value, _AFTER.get(e.name, ""))
            for e in importlib.metadata.entry_points(group=HARNESS_GROUP)}


HARNESS = _harness_modules()


@functools.cache
def _harness(name: str) -> Any:
    """The command ``name`` of the harness, imported now."""
    command = typer.main.get_command(importlib.import_module(HARNESS[name][0]).app)
    if command.name != name:
        raise RuntimeError(f"{HARNESS[name][0]}.app is {command.name!r}, not {name!r}")
    return command


class _Commands(MutableMapping[str, Any]):
    """The root's commands: the runtime's, and the harness's by name, each imported when it is
    first looked up (invoked, or listed by ``aiops --help``)."""

    def __init__(self, runtime: Mapping[str, Any]) -> None:
        self._runtime = dict(runtime)

    def __getitem__(self, name: str) -> Any:
        return _harness(name) if name in HARNESS else self._runtime[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._runtime[name] = command

    def __delitem__(self, name: str) -> None:
        del self._runtime[name]

    def __contains__(self, name: object) -> bool:
        return name in HARNESS or name in self._runtime

    def __iter__(self) -> Iterator[str]:
        names = [n for n in self._runtime if n not in HARNESS]
        for name, (_, after) in HARNESS.items():
            names.insert(names.index(after) + 1 if after in names else len(names), name)
        return iter(names)

    def __len__(self) -> int:
        return len(self._runtime.keys() | HARNESS.keys())


class _Root(TyperGroup):
    """``aiops``: the runtime's commands, and the harness's mounted by module name. The
    server and every other command never load the harness (import-linter's
    no-harness-in-runtime in pyproject.toml; tests/aiops/test_layers.py)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names only: listing imports nothing


app = typer.Typer(cls=_Root, no_args_is_help=True, add_completion=False,
                  help="Observability and AIOps for AI model serving.")
config_app = typer.Typer(no_args_is_help=True, help="Show or document the configuration.")
app.add_typer(config_app, name="config")
app.add_typer(token_app, name="token")
app.add_typer(models_app, name="models")
app.add_typer(attach_app, name="attach")
app.add_typer(sdk_app, name="sdk")

def _mount_optional() -> None:
    """Commands whose modules live beside the core (the agent, dashboards as code,
    Kubernetes)."""
    from agents.cli import ask
    from aiops.credentials import app as credentials_app
    from aiops.k8s.cli import app as k8s_app
    from dashboards.cli import app as dashboards_app

    app.command("ask")(ask)
    app.add_typer(dashboards_app, name="dashboards")
    app.add_typer(k8s_app, name="k8s")
    app.add_typer(credentials_app, name="credentials")


_mount_optional()



_settings, _fail = settings_of, fail


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
    from aiops.fileperms import private_umask
    from aiops.lake import LakeOptions
    from aiops.logs import configure_json_logging
    from aiops.server.app import create_app
    from aiops.server.connections import uvicorn_config
    from aiops.server.limits import ensure_descriptors, limit_memory
    from aiops.store import Store
    from aiops.tls import server_ssl_options
    from aiops.witness import from_settings

    settings = _settings(ctx)
    configure_json_logging(settings.log_level)
    try:
        ssl_options = server_ssl_options(settings)
    except AIOpsError as exc:
        raise _fail(exc, 2) from exc
    limit_memory(settings.server_memory_mb)
    # The connection cap counts every listener together; a gRPC connection takes three
    # descriptors (the caller's, and both ends of the relay's loopback one to gRPC).
    ensure_descriptors(settings.server_max_connections * (3 if settings.otlp_grpc_port else 1))
    # Everything this process creates is private from the start: the database and the WAL
    # DuckDB re-creates after each checkpoint, spill files, anchors, archive, tokens.
    private_umask()
    try:
        store = Store(settings.db_path, memory_limit_mb=settings.duckdb_memory_mb,
                      trace_index=settings.store_trace_index, witness=from_settings(settings),
                      lake=LakeOptions.of(settings))
        store.witness_heads()
        if not settings.admin_token:
            ensure_secret(settings.data_dir / ADMIN_TOKEN_FILE)
    except (AIOpsError, OSError) as exc:
        raise _fail(AIOpsError(str(exc))) from exc
    try:
        uvicorn.Server(uvicorn_config(
            create_app(settings, store), settings, log_level=settings.log_level.lower(),
            access_log=False, log_config=None,
            # In-flight requests get 5 s after SIGTERM; then the queries still running
            # are interrupted as the store closes (a query never holds shutdown).
            timeout_graceful_shutdown=5, **ssl_options)).run()
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

    # The client's token: AIOPS_TOKEN when set (an operator's gets the server's 403), else the
    # admin token where this machine has it; never the admin token behind AIOPS_TOKEN's back.
    try:
        with ServerClient.of(_settings(ctx)) as client:
            result = client.decide(action_id, approve, user=user)
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


@config_app.command("show")
def config_show(ctx: typer.Context) -> None:
    """Print the effective configuration; secrets (``SECRET_SETTINGS``) show only whether
    they are set, and credentials inside URLs (``user:pass@``, ``?token=``) are ``***``."""
    from aiops.redact import redacted_settings

    typer.echo(json.dumps(redacted_settings(_settings(ctx)), indent=2))


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


register_pack_commands(app)  # keygen, model-key, pack, verify: aiops/pack_cli.py


ledger_app = typer.Typer(no_args_is_help=True, help="Tamper-evident hash chains.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("verify")
def ledger_verify(
    ctx: typer.Context,
    table: Annotated[str, typer.Option(help="Chained table.")] = "provenance",
    offline: Annotated[bool, typer.Option(
        help="Open the DuckDB file directly (the server must be stopped).")] = False,
    witness: Annotated[Path | None, typer.Option(
        help="With --offline: check against this copy of the ledger witness instead of "
        "`ledger_witness_file`.")] = None,
) -> None:
    """Recompute a hash chain; exit 1 and say where if an entry was modified, deleted,
    inserted or reordered, the tail was cut off, or the chain differs from a head the
    ledger witness recorded."""
    from aiops.ledger import verify_table
    from aiops.witness import Witness, from_settings

    settings = _settings(ctx)
    if witness is not None and not offline:
        raise _fail(AIOpsError("--witness needs --offline (the server checks its own)"), 2)
    try:
        if offline:
            from aiops.store import Store

            store = Store(settings.db_path, witness=Witness(witness.absolute()) if witness
                          else from_settings(settings))
            try:
                report = verify_table(store, table)
            finally:
                store.close()
        else:
            import httpx

            from aiops.client import client_token
            from aiops.tls import client_verify

            token = client_token(settings)  # AIOPS_TOKEN, else the admin token here
            try:
                resp = httpx.get(f"{settings.server_url}/api/v1/ledger/{table}/verify",
                                 timeout=300, verify=client_verify(settings),
                                 headers={"authorization": f"Bearer {token}"} if token else None)
            except httpx.HTTPError as exc:
                raise AIOpsError(f"cannot reach the aiops server ({exc}); "
                                 "use --offline when it is stopped") from exc
            report = resp.json()
            if resp.status_code != 200:
                raise AIOpsError(report.get("error", resp.text))
    except (AIOpsError, ValueError) as exc:
        raise _fail(AIOpsError(str(exc))) from exc
    witnessed = report.get("witness")
    if report["ok"]:
        console.print(f"OK: {report['entries']} entries in {table}, chain intact"
                      + ("" if report["anchored"] else " (no anchor file found)")
                      + (f"; {witnessed['heads']} witnessed heads match, the last at seq "
                         f"{witnessed['last_seq']}" if witnessed else ""))
        if not witnessed:
            console.print("no ledger witness is configured: whoever can write the data "
                          "directory could rewrite entries and recompute the chain and its "
                          "anchor undetected (ledger_witness_file, docs/security.md)")
        return
    err_console.print(f"[red]TAMPERED[/red]: {table} ({report['entries']} entries)")
    for problem in report["problems"]:
        err_console.print(f"  {escape(problem)}")
    raise typer.Exit(1)

"""The stack's generated secrets: ``aiops credentials init|list|show``.

Nothing ships with a default password or token: a deployment's first start generates them
(docker compose's one-shot ``init`` service, a Kubernetes init container), every later start
finds and keeps them. What ``init`` makes in the data directory, each file mode 0600:

    admin.token                        the bootstrap admin token (CLI, approvals, control plane);
                                       not made when AIOPS_ADMIN_TOKEN is set
    credentials/serve.token            ingest token of the Serve replicas (may write provenance)
    credentials/ebpf.token             ingest token of the eBPF collector
    credentials/grafana.token          viewer token of Grafana's aiops API (Infinity) datasource
    credentials/prometheus.token       viewer token Prometheus scrapes /metrics with
    credentials/openai-api.key         API key of the OpenAI-compatible endpoints (AIOPS_API_KEYS)
    credentials/grafana-admin.password Grafana's admin password

Tokens are registered (hashed) in ``<data_dir>/tokens.json`` with their role, through
``aiops.auth.ensure_credential``: a second run reads the files and changes nothing.

Components in other containers, under other users, get copies of only their own files:
``--share grafana=DIR:UID`` writes Grafana's two files into DIR owned by UID (0600);
``--share prometheus=DIR:UID`` Prometheus' token. Run as root (compose's ``init``), the
data directory's files are given to the directory's owner (the unprivileged ``aiops`` user),
or to ``--owner``.

``--from DIR`` adopts secrets made elsewhere instead (a mounted Kubernetes Secret holding
files named as above): each file DIR has replaces the data directory's copy and is registered;
nothing else is generated.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from aiops.auth import (
    ADMIN_TOKEN_FILE,
    CREDENTIALS_DIR,
    MIN_TOKEN_CHARS,
    STACK_SOURCES,
    TOKENS_FILE,
    Role,
    TokenStore,
    ensure_credential,
    ensure_secret,
)
from aiops.errors import AIOpsError

__all__ = ["CREDENTIALS", "SHARES", "Credential", "Made", "app", "import_from", "init",
           "parse_share", "share"]


@dataclass(frozen=True)
class Credential:
    """One generated secret: ``file`` is its path relative to the data directory."""

    name: str
    file: str
    what: str
    kind: str  # "admin", "token" (registered in tokens.json) or "secret" (a password, a key)
    role: Role | None = None  # of a token; None with kind "token": the ingest scope

    @property
    def label(self) -> str:
        if self.kind == "token":
            if self.role is not None:
                return self.role.label
            return "ingest+provenance" if STACK_SOURCES.get(self.name) else "ingest"
        return self.kind


def _cred(name: str, what: str, role: Role | None = None, kind: str = "token",
          suffix: str = "token") -> Credential:
    return Credential(name, f"{CREDENTIALS_DIR}/{name}.{suffix}", what, kind, role)


CREDENTIALS: tuple[Credential, ...] = (
    Credential("admin", ADMIN_TOKEN_FILE, "bootstrap admin token (CLI, approvals, control "
               "plane)", "admin", Role.ADMIN),
    _cred("serve", "Serve replicas' OTLP export (may write provenance)"),
    _cred("ebpf", "eBPF collector's OTLP export"),
    _cred("grafana", "Grafana's aiops API datasource", Role.VIEWER),
    _cred("prometheus", "Prometheus' scrapes of /metrics and /metrics/otlp", Role.VIEWER),
    _cred("openai-api", "API key of the OpenAI-compatible endpoints (AIOPS_API_KEYS)",
          kind="secret", suffix="key"),
    _cred("grafana-admin", "Grafana's admin password (user admin)", kind="secret",
          suffix="password"),
)
BY_NAME = {c.name: c for c in CREDENTIALS}
# What each component outside the aiops containers gets a copy of (``--share``).
SHARES: dict[str, tuple[str, ...]] = {"grafana": ("grafana", "grafana-admin"),
                                      "prometheus": ("prometheus",)}


@dataclass(frozen=True)
class Made:
    credential: Credential
    path: Path
    state: str  # "generated", "kept" (it was there) or "imported" (``--from``)


def _register(data_dir: Path, c: Credential) -> None:
    """Make (or read) ``c`` in ``data_dir`` and register it when it is a token."""
    if c.kind == "admin" or c.kind == "secret":
        ensure_secret(data_dir / c.file)
    elif c.name in STACK_SOURCES:
        ensure_credential(data_dir, c.name, None, provenance=STACK_SOURCES[c.name])
    else:
        ensure_credential(data_dir, c.name, c.role)


def init(data_dir: Path, with_admin: bool = True) -> list[Made]:
    """Generate every credential ``data_dir`` lacks, keep the ones it has; register tokens.
    ``with_admin=False``: the admin token is configured elsewhere (AIOPS_ADMIN_TOKEN)."""
    made = []
    for c in CREDENTIALS:
        if c.kind == "admin" and not with_admin:
            continue
        path = data_dir / c.file
        existed = _readable_secret(path) is not None
        _register(data_dir, c)
        made.append(Made(c, path, "kept" if existed else "generated"))
    _private_dir(data_dir / CREDENTIALS_DIR)
    return made


def import_from(data_dir: Path, source: Path) -> list[Made]:
    """Adopt the credentials ``source`` holds (files named as in the data directory's
    ``credentials/``, the admin token as ``admin.token``): each replaces the data directory's
    copy and is registered. Nothing else is generated."""
    if not source.is_dir():
        raise AIOpsError(f"{source} is not a directory")
    made = []
    for c in CREDENTIALS:
        value = _readable_secret(source / Path(c.file).name)
        if value is None:
            continue
        path = data_dir / c.file
        _write_private(path, value)
        _register(data_dir, c)
        made.append(Made(c, path, "imported"))
    if not made:
        raise AIOpsError(f"{source} holds none of "
                         + ", ".join(Path(c.file).name for c in CREDENTIALS))
    _private_dir(data_dir / CREDENTIALS_DIR)
    return made


def share(data_dir: Path, component: str, dest: Path, owner: tuple[int, int] | None
          ) -> list[Path]:
    """Copy ``component``'s credentials into ``dest`` (0600, owned by ``owner``)."""
    if component not in SHARES:
        raise AIOpsError(f"no credentials to share with {component!r}: "
                         + ", ".join(sorted(SHARES)))
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SHARES[component]:
        c = BY_NAME[name]
        value = _readable_secret(data_dir / c.file)
        if value is None:
            raise AIOpsError(f"{data_dir / c.file} is missing: run `aiops credentials init`")
        target = dest / Path(c.file).name
        _write_private(target, value, owner)
        written.append(target)
    return written


def parse_share(spec: str) -> tuple[str, Path, tuple[int, int] | None]:
    """``component=DIR[:UID[:GID]]`` -> (component, DIR, (uid, gid) or None)."""
    component, sep, rest = spec.partition("=")
    if not sep or not rest:
        raise AIOpsError(f"--share {spec!r}: use COMPONENT=DIR[:UID[:GID]]")
    where, *ids = rest.split(":")
    if len(ids) > 2 or not all(i.isdigit() for i in ids):
        raise AIOpsError(f"--share {spec!r}: UID and GID are numbers")
    owner = (int(ids[0]), int(ids[1]) if len(ids) > 1 else -1) if ids else None
    return component.strip(), Path(where), owner


def give_to(owner: tuple[int, int], data_dir: Path) -> None:
    """Hand the credential files (and the token file) to ``owner``: what a root ``init``
    wrote must be readable by the unprivileged processes that use it."""
    paths = [data_dir / TOKENS_FILE, data_dir / CREDENTIALS_DIR,
             *(data_dir / c.file for c in CREDENTIALS)]
    for p in paths:
        if p.exists():
            os.chown(p, *owner)


def _readable_secret(path: Path) -> str | None:
    try:
        value = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if len(value) >= MIN_TOKEN_CHARS else None


def _write_private(path: Path, value: str, owner: tuple[int, int] | None = None) -> None:
    """``value`` into ``path``, mode 0600, replaced atomically (unchanged: not rewritten)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if _readable_secret(path) == value and (owner is None or path.stat().st_uid == owner[0]):
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _private_dir(path: Path) -> None:
    if path.is_dir():
        path.chmod(0o700)


# The command line (mounted into ``aiops`` as ``aiops credentials``).

app = typer.Typer(no_args_is_help=True, help="The stack's generated secrets (tokens, API key, "
                  "Grafana's password).")


def _data_dir(ctx: typer.Context, data_dir: Path | None) -> tuple[Path, Any]:
    from aiops.config import load_settings

    settings = ctx.obj if ctx.obj is not None else load_settings()
    return (data_dir or Path(settings.data_dir)), settings


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


DataDirOption = Annotated[Path | None, typer.Option(
    "--data-dir", help="Data directory (default: AIOPS_DATA_DIR).")]


@app.command("init")
def init_command(
    ctx: typer.Context,
    data_dir: DataDirOption = None,
    from_dir: Annotated[Path | None, typer.Option(
        "--from", help="Adopt the secrets this directory holds (a mounted Kubernetes Secret) "
        "instead of generating any.")] = None,
    shares: Annotated[list[str] | None, typer.Option(
        "--share", help="COMPONENT=DIR[:UID[:GID]]: copy grafana's or prometheus' "
        "credentials into DIR, owned by UID (repeatable).")] = None,
    owner: Annotated[str | None, typer.Option(
        help="UID[:GID] to own the data directory's credential files (default, as root: the "
        "data directory's owner).")] = None,
) -> None:
    """Generate the stack's secrets where missing, keep the existing ones, register the
    tokens; print what is where (never the values)."""
    directory, settings = _data_dir(ctx, data_dir)
    try:
        parsed = [parse_share(s) for s in shares or []]
        directory.mkdir(parents=True, exist_ok=True)
        if from_dir is not None:
            made = import_from(directory, from_dir)
        else:
            made = init(directory, with_admin=not settings.admin_token)
        data_owner = _owner(owner, directory)
        if data_owner is not None:
            give_to(data_owner, directory)
        shared = [(component, share(directory, component, dest, who))
                  for component, dest, who in parsed]
    except (AIOpsError, ValueError) as exc:
        raise _fail(str(exc), 2) from exc
    except OSError as exc:
        raise _fail(f"{exc.filename or directory}: {exc.strerror or exc}") from exc
    for m in made:
        typer.echo(f"{m.credential.name:14} {m.credential.label:18} {m.state:9} {m.path}")
    for component, paths in shared:
        typer.echo(f"shared with {component}: " + ", ".join(str(p) for p in paths))


def _owner(spec: str | None, data_dir: Path) -> tuple[int, int] | None:
    if spec is not None:
        uid, _, gid = spec.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise AIOpsError(f"--owner {spec!r}: use UID[:GID]")
        return int(uid), int(gid) if gid else -1
    if os.geteuid() != 0:
        return None
    st = data_dir.stat()
    return (st.st_uid, st.st_gid) if st.st_uid != 0 else None


@app.command("list")
def list_command(ctx: typer.Context, data_dir: DataDirOption = None) -> None:
    """Each credential: its role, its file, whether it is there (never the values)."""
    directory, _ = _data_dir(ctx, data_dir)
    registered = {e.get("name") for e in TokenStore(directory / TOKENS_FILE).entries()}
    for c in CREDENTIALS:
        path = directory / c.file
        there = _readable_secret(path) is not None
        state = "missing" if not there else (
            "unregistered" if c.kind == "token" and c.name not in registered else "present")
        typer.echo(f"{c.name:14} {c.label:18} {state:12} {path}  ({c.what})")


@app.command("show")
def show_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A credential's name, e.g. grafana-admin.")],
    data_dir: DataDirOption = None,
) -> None:
    """Print one credential's value (e.g. Grafana's admin password)."""
    directory, _ = _data_dir(ctx, data_dir)
    if name not in BY_NAME:
        raise _fail(f"unknown credential {name!r}: " + ", ".join(BY_NAME), 2)
    try:
        typer.echo((directory / BY_NAME[name].file).read_text().strip())
    except OSError as exc:
        raise _fail(f"{exc.filename}: {exc.strerror or exc} (run `aiops credentials init`)"
                    ) from exc

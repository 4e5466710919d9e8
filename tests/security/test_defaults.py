"""Secure defaults: no default password anywhere, nothing unauthenticated beyond loopback.

docker compose cannot run here (no Docker engine), so the compose stack's first start is
replayed on temp directories standing in for its volumes: the init service's own command
(``aiops credentials init``) runs, and each consumer's reference - Grafana's password file and
datasource token, Prometheus' credentials file, the API key the entrypoint exports - is
followed through that service's mounts to the file it would read.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from aiops.auth import Role, TokenStore, is_loopback
from aiops.cli import app
from aiops.config import Settings
from aiops.redact import SECRET_SETTINGS
from dashboards.datasources import INFINITY_PLUGIN
from tests.test_compose import _env

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Services that refuse an unauthenticated request, and how: their ports may be published
# beyond loopback (when the operator asks). Prometheus has no authentication.
AUTHENTICATED = {"aiops": "bearer token (AIOPS_SERVER_HOST beyond loopback)",
                 "ray-head": "API key (OpenAI endpoints), admin token (control plane)",
                 "grafana": "generated admin password"}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|_KEYS\b", re.IGNORECASE)
# Settings named like secrets that are not: a path to a key file, public keys' files.
NOT_SECRET = {"server_tls_key", "trusted_keys", "server_max_requests_per_token"}




def _ports(service: dict[str, Any]) -> list[tuple[str, bool]]:
    """(host address as an unconfigured `docker compose up` binds it, whether the operator
    may change it with a variable) of each published port."""
    out = []
    for port in service.get("ports", []):
        configurable = "${" in port
        port = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(port))
        host = port.rpartition(":")[0]
        out.append((host.rpartition(":")[0], configurable))
    return out


# The compose first start, replayed.

class Volumes:
    """Temp directories standing in for the named volumes; a container path of a service is
    the file its mounts put there."""

    def __init__(self, root: Path) -> None:
        self.dirs = {name: root / name for name in COMPOSE["volumes"]}
        for d in self.dirs.values():
            d.mkdir()

    def host(self, service: str, container_path: str) -> Path:
        best: tuple[str, Path] | None = None
        for volume in SERVICES[service].get("volumes", []):
            source, target = volume.split(":")[:2]
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                base = (ROOT / source) if source.startswith("./") else self.dirs.get(source)
                if base is not None and (best is None or len(target) > len(best[0])):
                    best = (target, base)
        assert best is not None, f"{service} mounts nothing at {container_path}"
        target, base = best
        return base / os.path.relpath(container_path, target)


@pytest.fixture
def first_start(tmp_path: Path) -> Volumes:
    """The init service's command, run as compose would, on temp volumes."""
    volumes = Volumes(tmp_path)
    init = SERVICES["init"]
    data_dir = volumes.host("init", _env(init)["AIOPS_DATA_DIR"])
    args = []
    for arg in init["command"][1:]:
        # A container path (in COMPONENT=DIR:UID) becomes the volume's temp directory.
        match = re.fullmatch(r"(\w+=)(/[^:]+)(:.*)?", arg)
        if match:
            owner = match.group(3) or ""
            if os.geteuid() != 0:  # chown to another user needs root; own it instead
                owner = f":{os.geteuid()}" if owner else ""
            arg = f"{match.group(1)}{volumes.host('init', match.group(2))}{owner}"
        args.append(arg)
    assert args[:2] == ["credentials", "init"]
    for _ in range(2):  # a restart finds and keeps everything
        result = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)])
        assert result.exit_code == 0, result.output
    return volumes


def _data(volumes: Volumes) -> Path:
    return volumes.host("aiops", _env(SERVICES["aiops"])["AIOPS_DATA_DIR"])


def _viewer(volumes: Volumes, token: str) -> None:
    principal = TokenStore(_data(volumes) / "tokens.json").lookup(token)
    assert principal is not None and principal.role == Role.VIEWER and not principal.ingest


def _private(path: Path) -> str:
    assert path.is_file(), path
    assert path.stat().st_mode & 0o777 == 0o600, f"{path}: {oct(path.stat().st_mode)}"
    value = path.read_text().strip()
    assert len(value) >= 32, path
    return value


def test_compose_has_no_default_password_or_token() -> None:
    for name, service in SERVICES.items():
        for key, value in _env(service).items():
            if SECRET_NAME.search(key):
                # Only a reference to a generated file, never a value or a ${VAR:-default}.
                assert key.endswith("__FILE") and value.startswith("/"), f"{name}: {key}"
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"PASSWORD[^\n]*:-", text) and "admin / admin" not in text


def test_every_published_port_is_loopback_or_its_service_authenticates() -> None:
    seen = set()
    for name, service in SERVICES.items():
        for address, configurable in _ports(service):
            seen.add(name)
            # By default everything binds the host's loopback ...
            assert address and is_loopback(address), f"{name}: binds {address or 'all'}"
            # ... and only what authenticates may be moved beyond it.
            assert not configurable or name in AUTHENTICATED, name
    assert seen == {"aiops", "ray-head", "prometheus", "grafana"}


def test_everything_starts_after_the_secrets_are_generated() -> None:
    assert SERVICES["init"]["command"][:3] == ["aiops", "credentials", "init"]
    for name, service in SERVICES.items():
        if name != "init":
            assert service["depends_on"]["init"] == {
                "condition": "service_completed_successfully"}, name
    # The server binds beyond loopback (in its container): it requires tokens.
    assert not is_loopback(_env(SERVICES["aiops"])["AIOPS_SERVER_HOST"])
    # The data volume (admin token, every credential) stays with the aiops containers.
    for name in ("prometheus", "grafana"):
        assert not any(v.startswith("aiops-data:") for v in SERVICES[name]["volumes"]), name


def test_grafana_password_and_datasource_token_come_from_generated_files(
        first_start: Volumes) -> None:
    env = _env(SERVICES["grafana"])
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    password = _private(first_start.host("grafana", env["GF_SECURITY_ADMIN_PASSWORD__FILE"]))
    assert password == (_data(first_start) / "credentials" / "grafana-admin.password"
                        ).read_text()
    provisioned = first_start.host("grafana", "/etc/grafana/provisioning/datasources")
    [api] = [d for d in yaml.safe_load((provisioned / "aiops.yaml").read_text())["datasources"]
             if d["type"] == INFINITY_PLUGIN]
    assert api["jsonData"]["auth_method"] == "bearerToken"
    match = re.fullmatch(r"\$__file\{(/[^}]+)\}", api["secureJsonData"]["bearerToken"])
    assert match, api["secureJsonData"]
    _viewer(first_start, _private(first_start.host("grafana", match.group(1))))


def test_prometheus_scrapes_the_server_with_a_generated_credentials_file(
        first_start: Volumes) -> None:
    config = first_start.host("prometheus", "/etc/prometheus/prometheus.yml")
    jobs = yaml.safe_load(config.read_text())["scrape_configs"]
    server_jobs = [j for j in jobs if any(t.startswith("aiops:") for s in j["static_configs"]
                                          for t in s["targets"])]
    assert len(server_jobs) == 2
    for job in server_jobs:
        auth = job["authorization"]
        assert auth.get("type", "Bearer") == "Bearer" and "credentials" not in auth
        _viewer(first_start, _private(first_start.host("prometheus",
                                                       auth["credentials_file"])))


@pytest.mark.parametrize("name", ["ray-head", "aiops"])
def test_the_openai_api_key_is_generated_and_exported(first_start: Volumes, name: str) -> None:
    service = SERVICES[name]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    [entry] = service["entrypoint"]
    [script] = [line.split()[1] for line in dockerfile.splitlines()
                if line.startswith("COPY ") and line.split()[-1].endswith(f"/{entry}")]
    data = first_start.host(name, _env(service)["AIOPS_DATA_DIR"])
    key = _private(data / "credentials" / "openai-api.key")
    env = {k: v for k, v in os.environ.items() if k != "AIOPS_API_KEYS"}
    run = subprocess.run(["sh", str(ROOT / script), "printenv", "AIOPS_API_KEYS"],
                         env={**env, "AIOPS_DATA_DIR": str(data)}, capture_output=True,
                         text=True, timeout=10, check=False)
    assert run.returncode == 0 and run.stdout.strip() == key, run.stderr
    # Without the generated key the service does not start without auth: it refuses to.
    missing = subprocess.run(["sh", str(ROOT / script), "true"],
                             env={**env, "AIOPS_DATA_DIR": str(data / "nowhere")},
                             capture_output=True, text=True, timeout=10, check=False)
    assert missing.returncode != 0 and "credentials init" in missing.stderr


# `aiops credentials init` itself.

def _files(data_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(data_dir)): p.read_text() for p in sorted(data_dir.rglob("*"))
            if p.is_file() and p.name != "tokens.json"}


def test_credentials_init_twice_keeps_the_same_secrets_private_and_registered(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    runner = CliRunner()
    env = {"AIOPS_ADMIN_TOKEN": ""}
    first = runner.invoke(app, ["credentials", "init", "--data-dir", str(data)], env=env)
    assert first.exit_code == 0, first.output
    generated = _files(data)
    assert set(generated) == {
        "admin.token", "credentials/serve.token", "credentials/ebpf.token",
        "credentials/grafana.token", "credentials/prometheus.token",
        "credentials/openai-api.key", "credentials/grafana-admin.password"}
    second = runner.invoke(app, ["credentials", "init", "--data-dir", str(data)], env=env)
    assert second.exit_code == 0, second.output
    assert _files(data) == generated and "generated" not in second.output
    # Values are never printed; every file (and the token registry) is 0600.
    assert not any(v in first.output + second.output for v in generated.values())
    for p in [*data.rglob("*")]:
        expected = 0o700 if p.is_dir() else 0o600
        assert p.stat().st_mode & 0o777 == expected, f"{p}: {oct(p.stat().st_mode)}"
    assert len(set(generated.values())) == len(generated)  # all distinct
    store = TokenStore(data / "tokens.json")
    roles = {}
    for rel, token in generated.items():
        principal = store.lookup(token)
        roles[Path(rel).stem] = None if principal is None else (
            principal.role.label if principal.role else
            "ingest+provenance" if principal.provenance else "ingest")
    assert roles == {"admin": None,  # the admin token is not in the registry: it is the file
                     "serve": "ingest+provenance", "ebpf": "ingest", "grafana": "viewer",
                     "prometheus": "viewer", "openai-api": None, "grafana-admin": None}
    shown = runner.invoke(app, ["credentials", "show", "grafana-admin", "--data-dir", str(data)])
    assert shown.output.strip() == generated["credentials/grafana-admin.password"]


def test_a_configured_admin_token_is_not_generated(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["credentials", "init", "--data-dir", str(tmp_path)],
                                env={"AIOPS_ADMIN_TOKEN": "a-configured-admin-token-0123456789"})
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "admin.token").exists()
    assert (tmp_path / "credentials" / "serve.token").is_file()


# `aiops config show`.

SENTINELS = {"admin_token": "admin-sentinel-0123456789abcdef",
             "api_keys": "apikey-sentinel-0123456789abcdef,second-key-0123456789",
             "slack_signing_secret": "slack-sentinel-0123456789abcdef",
             "agent_llm_api_key": "llm-sentinel-0123456789abcdef",
             "token": "client-sentinel-0123456789abcdef"}


def test_config_show_redacts_secrets_and_keeps_empty_ones_visible() -> None:
    import json

    assert set(SENTINELS) <= SECRET_SETTINGS
    env = {f"AIOPS_{k.upper()}": v for k, v in SENTINELS.items()}
    result = CliRunner().invoke(app, ["config", "show"], env=env)
    assert result.exit_code == 0, result.output
    for value in SENTINELS.values():
        for part in value.split(","):
            assert part not in result.output
    shown = json.loads(result.output)
    assert all(shown[k] and "redacted" in shown[k] for k in SENTINELS)
    assert shown["server_port"] == Settings().server_port  # the rest as it is
    empty = CliRunner().invoke(app, ["config", "show"], env={k: "" for k in env})
    assert empty.exit_code == 0, empty.output
    assert all(json.loads(empty.output)[k] == "" for k in SENTINELS)


def test_every_secret_like_setting_is_redacted() -> None:
    assert set(Settings.model_fields) >= SECRET_SETTINGS
    named_like = {n for n in Settings.model_fields
                  if re.search(r"token|key|secret|password|credential", n)}
    assert named_like - NOT_SECRET <= SECRET_SETTINGS, named_like - NOT_SECRET - SECRET_SETTINGS

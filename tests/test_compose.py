"""docker-compose.yml hangs together: no Docker engine runs here, so every reference it makes
is checked against the repository and the settings instead - images pinned, builds and mounted
paths present, ports the processes' own, addresses pointing at services, healthchecks.
(Its security - generated secrets, loopback ports - is tests/security/test_defaults.py's.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from aiops.config import Settings
from dashboards.datasources import DASHBOARDS_PATH, INFINITY_PLUGIN

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for f in service.get("env_file", []):
        for line in (ROOT / f).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key] = value
    return {**env, **{k: str(v) for k, v in (service.get("environment") or {}).items()}}


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume."""
    return [(v.split(":")[0], v.split(":")[1]) for v in service.get("volumes", [])]


def published(port: str) -> tuple[str, str, str]:
    """(host address, host port, container port) of a ``ports`` entry; a ``${VAR:-default}``
    address is its default (what an unconfigured ``docker compose up`` binds)."""
    port = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", port)
    host, _, rest = port.rpartition(":")
    address, _, host_port = host.rpartition(":")
    return address, host_port, rest


def _one_shot(service: dict[str, Any]) -> bool:
    """A service others wait for to complete (compose's init), not a long-running one."""
    return any((d or {}).get("condition") == "service_completed_successfully"
               for s in SERVICES.values() for n, d in (s.get("depends_on") or {}).items()
               if SERVICES.get(n) is service)


def test_the_stack_has_its_services() -> None:
    assert set(SERVICES) == {"init", "aiops", "ray-head", "ebpf", "prometheus", "grafana"}
    assert [n for n, s in SERVICES.items() if _one_shot(s)] == ["init"]
    assert SERVICES["init"]["restart"] == "no"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_image_is_pinned_and_every_build_exists(name: str) -> None:
    service = SERVICES[name]
    image = service["image"]
    assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), image
    if "build" in service:
        context = ROOT / service["build"]["context"]
        dockerfile = context / service["build"]["dockerfile"]
        assert dockerfile.is_file()
        version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert image == f"aiops:{version}"  # the tag is the project's version
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (context / source).exists(), f"{dockerfile}: COPY {source}"
        base = next(line.split()[1] for line in dockerfile.read_text().splitlines()
                    if line.startswith("FROM "))
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", base) and "latest" not in base


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_mounted_paths_exist_and_named_volumes_are_declared(name: str) -> None:
    for source, target in _mounts(SERVICES[name]):
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"{name}: {source} -> {target}"
        elif not source.startswith("/"):  # a named volume (host paths belong to the host)
            assert source in COMPOSE["volumes"], f"{name}: volume {source} is not declared"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck(name: str) -> None:
    if _one_shot(SERVICES[name]):  # done when it exits 0, which the others wait for
        return
    assert SERVICES[name]["healthcheck"]["test"]


def test_entrypoints_are_in_the_image() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = {line.split()[-1].rsplit("/", 1)[-1]: line.split()[1]
              for line in dockerfile.splitlines() if line.startswith("COPY ")}
    for name, service in SERVICES.items():
        for entry in service.get("entrypoint", []):
            if "/" not in entry and entry in copied:  # a script of deploy/, on PATH
                script = ROOT / copied[entry]
                assert script.read_text().startswith("#!/bin/sh"), name
                assert f"chmod 0755 /usr/local/bin/{entry}" in dockerfile


def test_ports_are_the_ones_the_processes_listen_on() -> None:
    defaults = Settings()
    server, serve = _env(SERVICES["aiops"]), _env(SERVICES["ray-head"])
    port, grpc = server["AIOPS_SERVER_PORT"], server["AIOPS_OTLP_GRPC_PORT"]
    assert [published(p)[1:] for p in SERVICES["aiops"]["ports"]] == [(port, port), (grpc, grpc)]
    assert int(server["AIOPS_SERVER_PORT"]) == defaults.server_port
    # OTLP's two standard ports (the test session turns gRPC off in its own environment).
    assert int(grpc) == Settings.model_fields["otlp_grpc_port"].default == 4317
    assert [published(p)[1:] for p in SERVICES["ray-head"]["ports"]] == [
        (serve["AIOPS_SERVE_PORT"], serve["AIOPS_SERVE_PORT"]),
        (serve["AIOPS_CONTROL_PORT"], serve["AIOPS_CONTROL_PORT"])]
    # Each process binds all interfaces (of its container) and reaches the others by their
    # service names.
    assert server["AIOPS_SERVER_HOST"] == "0.0.0.0" and serve["AIOPS_SERVE_HOST"] == "0.0.0.0"
    assert serve["AIOPS_SERVER_HOST"] == _env(SERVICES["ebpf"])["AIOPS_SERVER_HOST"] == "aiops"
    assert server["AIOPS_SERVE_HOST"] == "ray-head"
    assert server["AIOPS_SCRAPE_TARGETS"] == \
        f"ray=http://ray-head:{serve['AIOPS_RAY_METRICS_PORT']}/metrics"


def test_prometheus_scrapes_the_services_where_they_listen() -> None:
    [(config, target)] = [m for m in _mounts(SERVICES["prometheus"]) if m[0].startswith("./")]
    assert target == "/etc/prometheus/prometheus.yml"
    jobs = {j["job_name"]: j for j in yaml.safe_load((ROOT / config).read_text())
            ["scrape_configs"]}
    ray_port = _env(SERVICES["ray-head"])["AIOPS_RAY_METRICS_PORT"]
    assert {j: [t for s in job["static_configs"] for t in s["targets"]]
            for j, job in jobs.items()} == {
        "aiops-server": ["aiops:4318"], "aiops-otlp": ["aiops:4318"],
        "ray": [f"ray-head:{ray_port}"]}
    assert jobs["aiops-otlp"]["metrics_path"] == "/metrics/otlp"


def test_grafana_is_provisioned_from_the_generated_files() -> None:
    grafana = SERVICES["grafana"]
    mounts = dict((target, source) for source, target in _mounts(grafana))
    datasources = ROOT / mounts["/etc/grafana/provisioning/datasources"]
    providers = ROOT / mounts["/etc/grafana/provisioning/dashboards"]
    [provider] = yaml.safe_load((providers / "aiops.yaml").read_text())["providers"]
    # The provider reads the directory the generated dashboards are mounted at.
    assert provider["options"]["path"] == DASHBOARDS_PATH
    assert ROOT / mounts[DASHBOARDS_PATH] == ROOT / "dashboards" / "generated"
    urls = {d["type"]: d["url"] for d in
            yaml.safe_load((datasources / "aiops.yaml").read_text())["datasources"]}
    assert urls == {"prometheus": "http://prometheus:9090", INFINITY_PLUGIN: "http://aiops:4318"}
    assert [published(p)[1:] for p in SERVICES["prometheus"]["ports"]] == [("9090", "9090")]
    plugin, version = grafana["environment"]["GF_INSTALL_PLUGINS"].split()
    assert plugin == INFINITY_PLUGIN and re.fullmatch(r"\d+\.\d+\.\d+", version)
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / "generated" / Path(home).name).is_file()


def test_only_the_ebpf_collector_is_privileged() -> None:
    assert [n for n, s in SERVICES.items() if s.get("privileged")] == ["ebpf"]

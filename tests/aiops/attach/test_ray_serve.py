"""What a Serve application is to aiops: its service and version come from the app's own
OpenTelemetry settings where it has them (so telemetry and control name the same release),
else from its config's hash."""

from __future__ import annotations

from typing import Any

import pytest

from aiops.attach.ray_serve import AttachError, app_service, app_version, discover, service_map


def _config(**env: str) -> dict[str, Any]:
    return {"name": "chat", "import_path": "chat:app", "runtime_env": {"env_vars": env},
            "deployments": [{"name": "Chat", "num_replicas": 2}]}


def test_the_version_is_the_apps_own_service_version() -> None:
    assert app_version(_config(OTEL_SERVICE_VERSION="2.1")) == "2.1"
    assert app_version(_config(OTEL_RESOURCE_ATTRIBUTES="team=x, service.version=7")) == "7"


def test_without_one_the_version_is_the_configs_hash_and_changes_with_it() -> None:
    a, b = app_version(_config()), app_version(_config(LOG_LEVEL="debug"))
    assert a.startswith("cfg-") and len(a) == 12 and a != b
    assert app_version(_config()) == a  # stable for the same config


def test_the_service_is_the_otel_service_name_else_the_app_name() -> None:
    assert app_service("chat", _config(OTEL_SERVICE_NAME="chat-api")) == "chat-api"
    assert app_service("chat", _config()) == "chat"
    assert app_service("chat", None) == "chat"


def test_discovery_reads_running_replicas_and_replica_counts() -> None:
    details = {"applications": {"chat": {
        "status": "RUNNING", "last_deployed_time_s": 1.5,
        "deployed_app_config": _config(OTEL_SERVICE_VERSION="3"),
        "deployments": {"Chat": {
            "status": "HEALTHY", "target_num_replicas": 2,
            "deployment_config": {"name": "Chat", "num_replicas": 2},
            "replicas": [{"replica_id": "a1", "state": "RUNNING", "pid": 4242,
                          "node_ip": "10.0.0.7"},
                         {"replica_id": "b2", "state": "STARTING"}]}}},
        "adhoc": {"status": "RUNNING", "deployed_app_config": None, "deployments": {}}}}
    adhoc, chat = discover(details)
    assert (chat.service, chat.version, chat.status) == ("chat", "3", "RUNNING")
    assert chat.deployments[0].replicas == ("a1",) and chat.deployments[0].num_replicas == 2
    assert chat.deployments[0].processes == (("a1", 4242, "10.0.0.7"),)
    assert adhoc.config is None and adhoc.version == "imperative"


def test_an_answer_without_applications_is_an_error() -> None:
    with pytest.raises(AttachError, match="applications"):
        discover({"detail": "nope"})


def _app(name: str, nodes: dict[str, list[tuple[str, str]]],
         config: dict[str, Any]) -> dict[str, Any]:
    """An application as Ray's REST API reports it, with its ``deployment_topology``."""
    return {"status": "RUNNING", "deployed_app_config": config, "deployments": {},
            "deployment_topology": {"app_name": name, "nodes": {
                d: {"name": d, "app_name": name, "is_ingress": i == 0,
                    "outbound_deployments": [{"name": n, "app_name": a} for a, n in calls]}
                for i, (d, calls) in enumerate(nodes.items())}}}


def test_the_deployment_graph_becomes_calls_between_the_services_telemetry_names() -> None:
    gateway = _app("gateway", {"Router": [("gateway", "Auth"), ("chat", "Chat"),
                                          ("gone", "X")], "Auth": []},
                   {"name": "gateway", "runtime_env": {"env_vars": {
                       "OTEL_SERVICE_NAME": "edge"}}, "deployments": [
                       {"name": "Auth", "ray_actor_options": {"runtime_env": {"env_vars": {
                           "OTEL_SERVICE_NAME": "auth"}}}}]})
    chat = _app("chat", {"Chat": [("chat", "Tokenizer")], "Tokenizer": []},
                _config(OTEL_SERVICE_NAME="chat-api"))
    apps = discover({"applications": {"gateway": gateway, "chat": chat}})
    # Router (service edge) calls Auth (its own service) and the chat app; the chat app's
    # deployments share one service, so its inner call is no edge; an unknown app is skipped.
    assert service_map(apps).edges == {("edge", "auth"), ("edge", "chat-api")}


def test_a_cluster_without_the_graph_gives_no_calls() -> None:
    apps = discover({"applications": {"chat": {"status": "RUNNING", "deployments": {},
                                               "deployed_app_config": _config()}}})
    assert service_map(apps).edges == set()

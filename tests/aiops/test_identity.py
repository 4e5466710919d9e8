"""What aiops calls a Serve deployment and its release, defined once (aiops.identity) and read
the same by the server (Serve's REST answer) and the tracing exporter inside a replica (the
controller's answer): a deployment's own OpenTelemetry settings, then its app's, then Serve's
names; a release is the app's config, and scaling it is not a new one."""

from __future__ import annotations

from typing import Any

from aiops.identity import app_version, deployment_service, deployment_version, identities


def _shop(scorer_env: dict[str, str] | None = None, app_env: dict[str, str] | None = None,
          scorer_replicas: int = 1) -> dict[str, Any]:
    scorer: dict[str, Any] = {"name": "Scorer", "num_replicas": scorer_replicas}
    if scorer_env is not None:
        scorer["ray_actor_options"] = {"num_cpus": 0.1,
                                       "runtime_env": {"env_vars": scorer_env}}
    return {"name": "shop", "import_path": "shop:shop",
            "runtime_env": {"env_vars": app_env or {}},
            "deployments": [{"name": "Shop"}, {"name": "Tokenizer"}, scorer]}


def _answer(config: dict[str, Any]) -> dict[str, Any]:
    """An application as Serve's REST API (and its controller) reports it."""
    return {"status": "RUNNING", "deployed_app_config": config,
            "deployments": {d["name"]: {} for d in config["deployments"]},
            "deployment_topology": {"app_name": "shop", "ingress_deployment": "Shop", "nodes": {
                "Shop": {"name": "Shop", "is_ingress": True, "outbound_deployments": [
                    {"name": "Tokenizer", "app_name": "shop"},
                    {"name": "Scorer", "app_name": "shop"}]},
                "Tokenizer": {"name": "Tokenizer", "is_ingress": False},
                "Scorer": {"name": "Scorer", "is_ingress": False}}}}


def test_with_no_otel_settings_the_ingress_is_the_app_and_the_others_are_qualified() -> None:
    got = identities("shop", _answer(_shop()))
    assert {d: i.service for d, i in got.items()} == {
        "Shop": "shop", "Tokenizer": "shop.Tokenizer", "Scorer": "shop.Scorer"}
    # One release for the whole app: its config's hash.
    assert len({i.version for i in got.values()}) == 1
    assert got["Shop"].version.startswith("cfg-")


def test_a_deployments_own_service_name_wins_over_the_apps() -> None:
    config = _shop(scorer_env={"OTEL_SERVICE_NAME": "shop-scorer"},
                   app_env={"OTEL_SERVICE_NAME": "shop-frontend"})
    got = identities("shop", _answer(config))
    assert got["Scorer"].service == "shop-scorer"
    # The app's variable reaches every replica of the app: its other deployments share it.
    assert got["Shop"].service == got["Tokenizer"].service == "shop-frontend"
    assert deployment_service("shop", "Scorer", config, ingress=False) == "shop-scorer"


def test_an_explicit_version_is_used_as_is_at_the_deployment_or_the_app() -> None:
    config = _shop(scorer_env={"OTEL_RESOURCE_ATTRIBUTES": "service.version=2.0.0"},
                   app_env={"OTEL_SERVICE_VERSION": "1.4"})
    assert deployment_version(config, "Scorer") == "2.0.0"
    assert deployment_version(config, "Shop") == "1.4" == app_version(config)


def test_a_change_in_one_deployment_is_a_new_release_of_the_app() -> None:
    before, after = _shop(), _shop(scorer_env={"SCORER_ERROR_RATE": "0.3"})
    assert app_version(before) != app_version(after)
    assert identities("shop", _answer(after))["Tokenizer"].version == app_version(after)


def test_scaling_a_deployment_is_not_a_new_release() -> None:
    assert app_version(_shop(scorer_replicas=1)) == app_version(_shop(scorer_replicas=4))
    auto = _shop()
    auto["deployments"][2]["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 3}
    assert app_version(auto) == app_version(_shop())
    # aiops' own scale may list a deployment the config did not: still the same release.
    listed = _shop()
    listed["deployments"].append({"name": "Extra", "num_replicas": 2})
    assert app_version(listed) == app_version(_shop())


def test_an_imperative_app_has_no_release_to_return_to() -> None:
    got = identities("adhoc", {"status": "RUNNING", "deployed_app_config": None,
                               "deployments": {"Model": {}}})
    assert got["Model"].service == "adhoc" and got["Model"].version == "imperative"

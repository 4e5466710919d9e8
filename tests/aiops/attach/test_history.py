"""Which Serve config a rollback returns to: one that ran RUNNING for the healthy period with
no open incident on it, kept across restarts."""

from __future__ import annotations

from pathlib import Path

from aiops.attach.history import ConfigHistory
from aiops.attach.ray_serve import ServeApp, discover

S = 1_000_000_000


def _app(version: str, status: str = "RUNNING") -> ServeApp:
    return ServeApp("chat", "chat", version, status, {"name": "chat", "v": version})


def test_a_config_becomes_healthy_after_running_the_whole_period(tmp_path: Path) -> None:
    h = ConfigHistory(tmp_path / "h.json", healthy_after_s=10)
    assert h.observe([_app("1")], set(), 0) == []
    assert h.observe([_app("1")], set(), 9 * S) == []
    assert h.observe([_app("1")], set(), 10 * S) == [("chat", "1")]
    assert h.observe([_app("1")], set(), 20 * S) == []  # kept once
    assert [x.version for x in h.healthy("chat")] == ["1"]


def test_an_open_incident_or_a_status_other_than_running_restarts_the_clock(
        tmp_path: Path) -> None:
    h = ConfigHistory(tmp_path / "h.json", healthy_after_s=10)
    h.observe([_app("2")], set(), 0)
    h.observe([_app("2")], {("chat", "2")}, 5 * S)
    assert h.observe([_app("2")], set(), 12 * S) == []
    h.observe([_app("2", "DEPLOYING")], set(), 13 * S)
    assert h.observe([_app("2")], set(), 20 * S) == []
    assert h.observe([_app("2")], set(), 30 * S) == [("chat", "2")]


def test_the_last_healthy_other_version_is_the_rollback_target_and_survives_restarts(
        tmp_path: Path) -> None:
    h = ConfigHistory(tmp_path / "h.json", healthy_after_s=1)
    for i, v in enumerate(["1", "2"]):
        h.observe([_app(v)], set(), i * 10 * S)
        h.observe([_app(v)], set(), (i * 10 + 2) * S)
    again = ConfigHistory(tmp_path / "h.json", healthy_after_s=1)
    good = again.last_healthy("chat", other_than="3")
    assert good is not None and good.version == "2" and good.config["v"] == "2"
    older = again.last_healthy("chat", other_than="2")
    assert older is not None and older.version == "1"
    assert again.last_healthy("other") is None


def test_an_unreadable_history_file_is_ignored_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "h.json").write_text("{not json")
    assert ConfigHistory(tmp_path / "h.json", 1).healthy("chat") == []


def _composed(version: str) -> ServeApp:
    """A composed app: ingress 'shop' calling deployment 'Scorer' (its own service)."""
    return discover({"applications": {"shop": {
        "status": "RUNNING", "deployed_app_config": {
            "name": "shop", "v": version, "runtime_env": {"env_vars": {
                "OTEL_SERVICE_VERSION": version}},
            "deployments": [{"name": "Shop"}, {"name": "Scorer"}]},
        "deployments": {"Shop": {}, "Scorer": {}},
        "deployment_topology": {"nodes": {"Shop": {"is_ingress": True},
                                          "Scorer": {"is_ingress": False}}}}}})[0]


def test_an_incident_on_any_deployment_of_a_composed_app_keeps_its_release_unhealthy(
        tmp_path: Path) -> None:
    h = ConfigHistory(tmp_path / "h.json", healthy_after_s=10)
    app = _composed("2.0.0")
    assert app.services == ("shop", "shop.Scorer")
    for t in range(0, 60, 5):  # the Scorer fails throughout: never healthy
        assert h.observe([app], {("shop.Scorer", "2.0.0")}, t * S) == []
    # An incident naming the Scorer with no version cannot clear the release either.
    assert h.observe([app], {("shop.Scorer", "")}, 70 * S) == []
    assert h.observe([app], set(), 75 * S) == []
    assert h.observe([app], set(), 85 * S) == [("shop", "2.0.0")]

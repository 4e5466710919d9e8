"""Configuration is typed, read once from file + environment, and documented."""

from pathlib import Path

import pytest

from aiops.config import Settings, load_settings, settings_reference
from aiops.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_need_no_file_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOPS_CONFIG", raising=False)
    s = load_settings()
    assert s.server_port == 4318
    assert s.db_path == Path(".aiops/telemetry.duckdb")


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "aiops.toml"
    cfg.write_text('server_port = 5000\nserve_port = 9000\n')
    monkeypatch.setenv("AIOPS_CONFIG", str(cfg))
    monkeypatch.setenv("AIOPS_SERVE_PORT", "9100")
    s = load_settings()
    assert (s.server_port, s.serve_port) == (5000, 9100)


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValueError):
        s.server_port = 1  # type: ignore[misc]


def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOPS_SERVER_PORT", "not-a-port")
    with pytest.raises(ConfigError, match="AIOPS_SERVER_PORT"):
        load_settings()


def test_an_unknown_key_in_the_file_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "aiops.toml"
    cfg.write_text('server_prot = 5000\n')
    with pytest.raises(ConfigError, match="SERVER_PROT"):
        load_settings(cfg)


def test_a_missing_or_broken_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("server_port = = 1")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_settings(broken)


def test_every_setting_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == settings_reference(), "docs/configuration.md is stale: run `make docs`"
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description"
        assert f"AIOPS_{name.upper()}" in doc


_VLLM = '[{"kind": "vllm", "name": "v", "url": "http://127.0.0.1:1"}]'


@pytest.mark.parametrize(("mode", "configured", "managed", "embedded"), [
    ("auto", False, None, True),  # a plain server: the stack `aiops up` (or compose) runs
    ("auto", True, None, False),  # attach targets in the config file
    ("auto", False, _VLLM, False),  # added with `aiops attach add`
    ("auto", False, "[]", True),  # the last one removed again
    ("auto", False, "{not json", False),  # a broken file: attach-only was meant
    ("on", True, None, True),  # what `aiops up` sets
    ("off", False, None, False)])
def test_the_agents_llm_defaults_to_the_stack_only_where_the_stack_is(
        tmp_path: Path, mode: str, configured: bool, managed: str | None,
        embedded: bool) -> None:
    from aiops.config import AttachTarget
    from aiops.server.app import _embedded

    targets = (AttachTarget(kind="ray", name="r", url="http://127.0.0.1:1"),) if configured \
        else ()
    if managed is not None:
        (tmp_path / "attach.json").write_text(managed)
    s = load_settings(data_dir=tmp_path, embedded_stack=mode, attach=targets)
    assert s.embedded_expected is embedded is _embedded(s)  # the server's own answer
    # Unset, the stack's Serve endpoint where the stack is; elsewhere serve_url is the
    # attached team's app, not an LLM: none.
    assert s.agent_llm_base == (f"{s.serve_url}/v1" if embedded else None)
    # An LLM that is named is the one used, whatever runs beside the server; `none` is none.
    named = s.model_copy(update={"agent_llm_url": "http://llm.example:9000/v1"})
    assert named.agent_llm_base == "http://llm.example:9000/v1"
    assert s.model_copy(update={"agent_llm_url": " None "}).agent_llm_base is None

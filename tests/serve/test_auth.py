"""API keys: Bearer tokens against the configured set; none configured means open."""

import pytest

from serve.auth import authorized

KEYS = ("k-alpha", "k-beta")


@pytest.mark.parametrize(("header", "ok"), [
    ("Bearer k-alpha", True),
    ("bearer k-beta", True),
    ("Bearer  k-beta ", True),
    ("Bearer k-gamma", False),
    ("Bearer ", False),
    ("k-alpha", False),
    ("Basic k-alpha", False),
    (None, False),
])
def test_only_a_configured_bearer_key_passes(header: str | None, ok: bool) -> None:
    assert authorized(header, KEYS) is ok


def test_without_configured_keys_everything_passes() -> None:
    assert authorized(None, ())
    assert authorized("Bearer anything", [])

from __future__ import annotations

import pytest

from serve.specs import ModelSpec, load_specs


@pytest.fixture(scope="session")
def default_specs() -> dict[str, ModelSpec]:
    """The packaged default model stack, by model type (the first of a type: the users' chat
    model, not the agent's own)."""
    specs: dict[str, ModelSpec] = {}
    for s in load_specs():
        specs.setdefault(s.model_type.value, s)
    return specs

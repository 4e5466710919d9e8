from __future__ import annotations

import pytest

from serve.specs import ModelSpec, load_specs


@pytest.fixture(scope="session")
def default_specs() -> dict[str, ModelSpec]:
    """The packaged default model stack, by model type."""
    return {s.model_type.value: s for s in load_specs()}

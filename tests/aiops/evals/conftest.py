"""Every test here is an offline evaluation on a dataset (CPU work, no timing): marked
`offline`, which `make test` runs at idle priority beside the stack lane."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.offline)

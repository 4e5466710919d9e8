"""The eBPF tests need root and a kernel that allows BPF: elsewhere they skip with the
collector's own reason, unless AIOPS_REQUIRE_EBPF=1 (set by `make test` as root, i.e. in CI),
where a skip would hide a broken collector and fails instead."""

from __future__ import annotations

import os

import pytest

from collectors.ebpf.collector import preflight


@pytest.fixture(scope="session")
def ebpf_allowed() -> None:
    problems = preflight()
    if not problems:
        return
    reason = "eBPF collector cannot run here: " + "; ".join(problems)
    if os.environ.get("AIOPS_REQUIRE_EBPF") == "1":
        pytest.fail(reason)
    pytest.skip(reason)

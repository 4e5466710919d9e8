"""The server's process limits: room for every listener's connection cap at once."""

from __future__ import annotations

import resource
import subprocess
import sys


def test_the_descriptor_limit_is_raised_to_fit_the_listeners_caps() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 * 2
    code = ("import resource; from aiops.server.limits import ensure_descriptors; "
            f"print(ensure_descriptors({want}), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))).stdout
    expected = want + 1024 if hard == resource.RLIM_INFINITY else min(want + 1024, hard)
    assert out.split() == [str(expected), str(expected)]
    assert soft  # this process' own limit is untouched

"""Incident memory over real analyzer incidents: left out in turn, each fixture's nearest
remembered incident is the same kind of failure (the full table is `aiops bench memory`)."""

from __future__ import annotations

import pytest

from aiops_harness.agent_evals.cases import load_cases
from aiops_harness.agent_evals.memory import run_memory_eval

pytestmark = pytest.mark.slow


SUBSET = ("crash-loop-echo", "crash-loop-smollm2", "oom-ppocr-twice", "oom-smollm2",
          "errors-minilm-v2-onnx", "config-minilm-max-length")


def test_left_out_incidents_recall_one_of_their_kind() -> None:
    cases = [c for c in load_cases() if c.name in SUBSET]
    r = run_memory_eval(cases)
    assert len(r.items) == len(SUBSET)
    assert r.recalled == 1.0
    assert r.rate(lambda a, b: a.fault_class == b.fault_class) == 1.0
    # Not the case itself, and never a healthy or other-class incident.
    assert all(r.nearest[it.case][0] is not it for it in r.items)

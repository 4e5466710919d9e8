"""The eval runner: it scores every case, and an LLM endpoint that keeps failing costs a few
timeouts, not one per case."""

from __future__ import annotations

import pytest

from agents.agent import make_llm
from aiops_harness.agent_evals.cases import load_cases
from aiops_harness.agent_evals.run import LLM_DOWN_AFTER, run_eval
from aiops_harness.bench.common import free_port

pytestmark = pytest.mark.slow


def test_an_unreachable_llm_is_asked_only_until_it_has_failed_three_cases_in_a_row() -> None:
    cases = [c for c in load_cases() if c.expect.component is not None][:LLM_DOWN_AFTER + 1]
    # Nothing listens on this loopback port: every call is refused.
    llm = make_llm(f"http://127.0.0.1:{free_port()}/v1", "smollm2-135m-instruct", timeout_s=5)
    report = run_eval(cases, llm, "smollm2-135m-instruct")
    asked, skipped = report.results[:LLM_DOWN_AFTER], report.results[LLM_DOWN_AFTER:]
    assert all((r.narrative_problem or "").startswith("LLM unavailable") for r in asked)
    assert [r.narrative_problem for r in skipped] == [
        f"not asked: the LLM failed {LLM_DOWN_AFTER} cases in a row"]
    # The facts do not depend on the LLM; the narratives count as not standing.
    assert report.pass_rate == 1.0 and report.pass_rate_with_narrative == 0.0
    assert all(r.narrative_source == "template" for r in report.results)

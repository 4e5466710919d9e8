"""The telemetry-question fixtures: enough of them, every kind in both languages, with and
without an incident; each passes against the reference, and a wrong figure would not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents.intent_knn import load_examples
from aiops_harness.agent_evals.cases import CASES_DIR, load_case
from aiops_harness.agent_evals.questions import load_questions, run_questions, score

QUESTIONS = load_questions()
KINDS = {"latency", "traces", "logs", "changes", "compare", "saturation", "throughput", "slo"}


def test_there_are_enough_varied_questions() -> None:
    assert len(QUESTIONS) >= 60
    assert {q.expect.kind for q in QUESTIONS} == KINDS
    chinese = [q for q in QUESTIONS if re.search(r"[\u4e00-\u9fff]", q.question)]
    for kind in KINDS:
        assert any(q.expect.kind == kind for q in chinese), kind
    assert any(q.case.startswith("healthy") for q in QUESTIONS)  # no incident behind them
    assert len({q.question for q in QUESTIONS}) == len(QUESTIONS)


def test_every_question_is_answered_right_and_a_wrong_figure_is_caught() -> None:
    results = run_questions(QUESTIONS)
    failed = [(r.question, r.why) for r in results if not r.passed]
    assert failed == []
    # The same answer with one figure off fails its check.
    r = next(r for r in results if r.kind == "latency" and r.answer.report
             and r.answer.report.rows)
    assert r.answer.report is not None
    row = r.answer.report.rows[0]
    key = next(k for k in row if k.endswith("_ms"))
    row[key] += 1.0
    q = next(q for q in QUESTIONS if q.question == r.question)
    checks, _ = score(q, load_case(CASES_DIR / r.case), r.answer)
    assert checks["facts"] is False


EVALS = Path(__file__).parents[3] / "harness" / "aiops_harness" / "agent_evals"
HELD_OUT = load_questions(EVALS / "questions_heldout.yaml")
# The held-out sets whose misses have since been read and fixed (dev sets now); the fourth
# (questions_heldout4.yaml) is measured, not tested: docs/benchmarks.md has its first run.
DEV_SETS = ["questions_heldout.yaml", "questions_heldout2.yaml", "questions_heldout3.yaml"]


def test_the_held_out_questions_were_never_made_examples() -> None:
    """The held-out set measures phrasings nobody tuned to: none of its questions (nor a
    near copy) is among the examples reader's labelled examples."""
    examples = {t.lower().strip() for ts in load_examples().values() for t in ts}
    for q in HELD_OUT:
        assert q.question.lower().strip() not in examples, q.question
        # A near copy: an example that is most of the question (a short common phrase such
        # as "top error logs" inside a longer question is not one).
        assert not any(e in q.question.lower() and len(e) >= 0.6 * len(q.question)
                       for e in examples), q.question


@pytest.mark.parametrize("name", DEV_SETS)
def test_the_held_out_questions_are_mostly_answered_right(name: str) -> None:
    """Questions written without reading the rules (docs/benchmarks.md has each set's first
    run before any change: 42/48, 41/50, 43/50): at least 90% in English and in Chinese."""
    results = run_questions(load_questions(EVALS / name))
    by_language: dict[str, list[bool]] = {}
    for r in results:
        chinese = re.search(r"[\u4e00-\u9fff]", r.question) is not None
        by_language.setdefault("zh" if chinese else "en", []).append(r.passed)
    for language, passed in by_language.items():
        assert sum(passed) >= 0.9 * len(passed), (language, [
            (r.question, r.why) for r in results if not r.passed])

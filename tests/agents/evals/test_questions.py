"""The telemetry-question fixtures: enough of them, every kind in both languages, with and
without an incident; each passes against the reference, and a wrong figure would not."""

from __future__ import annotations

import re

from agents.evals.cases import CASES_DIR, load_case
from agents.evals.questions import load_questions, run_questions, score

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

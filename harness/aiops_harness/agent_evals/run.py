"""Run the agent over the incident fixtures and score its answers.

For each case: a fresh DuckDB file gets the case's telemetry, the live analyzer replays it
round by round up to the moment of the question, and the agent answers the question at that
moment. Scoring is deterministic: the answer's facts against the case's expectations
(component, version, fault class, onset within +-60 s), and, when an LLM wrote the
narrative, whether that narrative stood (cited evidence that exists, contradicted nothing).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from agents.agent import Agent, Answer
from agents.tools import Toolbox
from aiops.analytics.findings import Finding
from aiops.store import Store
from aiops_harness.agent_evals.cases import Case, load_telemetry
from aiops_harness.agent_evals.replay import replay

if TYPE_CHECKING:
    from llama_index.core.llms import LLM

__all__ = ["CaseResult", "EvalReport", "run_case", "run_eval", "score"]

ONSET_TOLERANCE_S = 60.0
LLM_DOWN_AFTER = 3


@dataclass
class CaseResult:
    case: str
    tags: list[str]
    checks: dict[str, bool]  # component, version, fault_class, onset, cites
    narrative_source: str
    narrative_ok: bool | None  # None: no LLM narrative was asked for
    narrative_problem: str | None
    answer: Answer
    seconds: float

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    @property
    def passed_with_narrative(self) -> bool:
        return self.passed and bool(self.narrative_ok)


@dataclass
class EvalReport:
    results: list[CaseResult] = field(default_factory=list)
    llm: str | None = None

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.results) / max(len(self.results), 1)

    @property
    def pass_rate_with_narrative(self) -> float | None:
        if self.llm is None:
            return None
        return sum(r.passed_with_narrative for r in self.results) / max(len(self.results), 1)


def _ns(t: str | None) -> int | None:
    if not t:
        return None
    return int(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1e9)


def score(case: Case, answer: Answer) -> dict[str, bool]:
    """Each expected fact, checked; a case expecting no incident passes on none reported."""
    e, f = case.expect, answer.facts
    if e.component is None:
        asked = _asked_model(answer)
        return {"no_incident": f is None or (asked is not None and f.component != asked)}
    if f is None:
        return {"component": False}
    checks = {"component": f.component == e.component}
    if e.version is not None:
        checks["version"] = f.version == e.version
    if e.fault_class is not None:
        checks["fault_class"] = f.fault_class == str(e.fault_class)
    if case.onset_ns is not None:
        onset = _ns(f.onset)
        checks["onset"] = onset is not None and \
            abs(onset - case.onset_ns) <= ONSET_TOLERANCE_S * 1e9
    if e.replica is not None:
        checks["replica"] = f.replica == e.replica
    # The answer itself names the incident and a trace behind it.
    checks["cites"] = f.incident_id in answer.text and (
        not any(ev.kind == "trace" for ev in answer.evidence)
        or any(ev.id in answer.text for ev in answer.evidence if ev.kind == "trace"))
    return checks


def _asked_model(answer: Answer) -> str | None:
    return answer.intent.model


def run_case(case: Case, llm: LLM | None = None, workdir: Path | None = None) -> CaseResult:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        store = Store(Path(tmp) / "case.duckdb")
        try:
            load_telemetry(case, store)
            held: dict[tuple[str, str, str], Finding] = {}  # what was found, not paged
            replay(case, store, held=held)
            now = case.now_ns
            box = Toolbox(store, now=lambda: now, objectives=case.analyzer_objectives(),
                          findings=lambda: list(held.values()))
            answer = Agent(box, llm).ask(case.question)
        finally:
            store.close()
    checks = score(case, answer)
    n = answer.narrative
    narrative_ok = None if llm is None else (n.source == "llm" and bool(n.cited)
                                             and n.rejected is None)
    if llm is not None and answer.facts is None:
        narrative_ok = True  # nothing to narrate: the template's "no incident" is the answer
    return CaseResult(case.name, case.tags, checks, n.source, narrative_ok, n.rejected, answer,
                      round(time.monotonic() - started, 2))


def run_eval(cases: list[Case], llm: LLM | None = None, llm_name: str | None = None,
             progress: Callable[[CaseResult], None] | None = None) -> EvalReport:
    report = EvalReport(llm=llm_name if llm is not None else None)
    down = 0  # consecutive cases whose LLM call failed (timed out, refused)
    for case in cases:
        if llm is not None and down >= LLM_DOWN_AFTER:
            # An endpoint that failed this often in a row is down or hung: waiting out its
            # timeout on every remaining case would only make the report late, not better.
            result = run_case(case, None)
            result.narrative_ok = result.answer.facts is None  # nothing to narrate: it stands
            result.narrative_problem = (f"not asked: the LLM failed {LLM_DOWN_AFTER} cases "
                                        "in a row")
        else:
            result = run_case(case, llm)
            unavailable = (result.narrative_problem or "").startswith("LLM unavailable")
            down = down + 1 if unavailable else 0
        report.results.append(result)
        if progress is not None:
            progress(result)
    return report

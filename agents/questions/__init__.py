"""Questions about the telemetry itself - latency percentiles, slowest or failed traces, error
logs and new templates, what changed, two versions side by side, saturation, token
throughput, SLOs, capacity for more load - answered from the store, each figure with the SQL
it came from."""

from __future__ import annotations

from collections.abc import Callable

from agents.intent import Intent, IntentKind
from agents.questions import capacity, changes, latency, logs, saturation, slo, traces, why
from agents.questions.model import Ask, CitedQuery, Report
from agents.tools import Toolbox

__all__ = ["CitedQuery", "Report", "answer", "explain_without_incident"]

_ANSWERS: dict[IntentKind, tuple[str, Callable[[Ask], None]]] = {
    IntentKind.LATENCY: ("Latency", latency.latency),
    IntentKind.TRACES: ("Traces", traces.traces),
    IntentKind.LOGS: ("Logs", logs.logs),
    IntentKind.CHANGES: ("What changed", changes.changes),
    IntentKind.COMPARE: ("Versions compared", latency.compare),
    IntentKind.SATURATION: ("Saturation", saturation.saturation),
    IntentKind.THROUGHPUT: ("Throughput", latency.throughput),
    IntentKind.SLO: ("SLO and error budget", slo.slo),
    IntentKind.CAPACITY: ("Capacity", capacity.capacity),
}


def answer(box: Toolbox, intent: Intent, question: str) -> Report | None:
    """The report for a telemetry intent; None for any other intent."""
    entry = _ANSWERS.get(intent.kind)
    if entry is None:
        return None
    headline, fill = entry
    ask = Ask(box, intent, question, headline)
    fill(ask)
    if intent.model is None and intent.kind is not IntentKind.CHANGES:
        ask.report.lines.insert(0, "No model named: every model.")
    return ask.report


def explain_without_incident(box: Toolbox, intent: Intent, question: str) -> Report:
    """What the telemetry shows of a model no incident names (agents.questions.why): its
    minutes that ran slow, the spans that grew, what changed in the window."""
    ask = Ask(box, intent, question, "No incident: what its requests show")
    why.why(ask)
    return ask.report

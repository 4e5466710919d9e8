"""With a lake, the agent answers from every server's telemetry: a question about a model
that another server's cluster serves gets that server's figures, while detection keeps
reading its own server's rows."""

from __future__ import annotations

import pytest

from agents.agent import Agent
from agents.tools import Toolbox
from aiops.store import Store
from tests.aiops.analytics.telemetry import NS, T0, add_logs, add_spans, log, span
from tests.lake import lake_of, pg, two

__all__ = ["lake_of", "pg", "two"]  # fixtures

pytestmark = pytest.mark.lake


def _requests(store: Store, model: str, n: int, duration_ms: float) -> None:
    """``n`` requests to ``model`` in the last five minutes: the ingress span and the
    replica's under it, as the stack records them."""
    rows = []
    for i in range(n):
        root = span(T0 - 300 * NS + i * NS, duration_ms, model, "v1", "ingress")
        child = span(T0 - 300 * NS + i * NS, duration_ms - 1, model, "v1")
        child["trace_id"], child["parent_span_id"] = root["trace_id"], root["span_id"]
        rows += [root, child]
    add_spans(store, rows)


def test_the_agent_answers_about_a_model_another_server_serves(two: tuple[Store, Store]
                                                               ) -> None:
    a, b = two
    _requests(a, "echo", 30, 40)
    _requests(b, "whisper", 20, 900)
    add_logs(b, [log(T0 - 60 * NS, "CUDA out of memory", 17, service="whisper")])
    assert a.commit_lake().rows == 60 and b.commit_lake().rows == 41

    answer = Agent(Toolbox(a, now=lambda: T0)).ask(
        "what is the p95 latency of whisper over the last 10 minutes?")
    assert answer.report is not None and len(answer.report.rows) == 1
    assert answer.report.rows[0]["requests"] == 20
    assert answer.report.rows[0]["p95_ms"] >= 900

    # The SQL tool reads every server with the table names it documents.
    sql = Toolbox(a, now=lambda: T0).call(
        "run_sql", sql="SELECT service_name, count(*) AS n FROM spans "
                       "WHERE service_name <> 'ingress' GROUP BY 1 ORDER BY 1")
    assert sql.data["rows"] == [["echo", 30], ["whisper", 20]]
    found = Toolbox(a, now=lambda: T0).call("log_lookup", model="whisper", minutes=10)
    assert [r["message"] for r in found.data] == [{"telemetry_text": "CUDA out of memory"}]

    # Detection's reads stay this server's own.
    assert a.query("SELECT DISTINCT service_name FROM spans ORDER BY 1").rows == [
        ("echo",), ("ingress",)]


def test_rows_not_yet_committed_are_read_once(two: tuple[Store, Store]) -> None:
    a, b = two
    _requests(a, "echo", 10, 40)
    _requests(b, "whisper", 5, 900)
    assert b.commit_lake().rows == 10  # a's are still only in its outbox
    box = Toolbox(a, now=lambda: T0)
    counts = box.call("run_sql", sql="SELECT service_name, count(*) FROM spans "
                                     "GROUP BY 1 ORDER BY 1").data["rows"]
    assert counts == [["echo", 10], ["ingress", 15], ["whisper", 5]]
    a.commit_lake()
    assert box.call("run_sql", sql="SELECT count(*) FROM spans").data["rows"] == [[30]]

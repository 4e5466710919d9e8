"""Every query of every committed dashboard, executed against real backends, returns data.

PromQL goes to Debian's Prometheus scraping the real stack (server, re-exposed OTLP serving
metrics, Ray) while live traffic flows. Infinity queries go to the real aiops server: the
stack's for telemetry (spans, metric points, eBPF), and an in-process server seeded with an
incident, an action and its ledger entry for the incidents dashboard (the stack opens
incidents only when something goes wrong). Each Infinity answer is passed through the query's
own root selector (JSONata, as Infinity's backend parser does) and must yield rows carrying
every declared column.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonata
import pyarrow as pa
import pytest

from aiops.config import Settings
from aiops.schema import ACTIONS, INCIDENTS
from collectors.ebpf.collector import preflight
from dashboards.generate import GENERATED, PACKAGE_DIR
from dashboards.inspect import DashboardQuery, queries, variables
from tests.conftest import RunningServer
from tests.dashboards.conftest import LLM, RunningPrometheus, Traffic

pytestmark = pytest.mark.stack

DASHBOARDS = {p.stem: json.loads(p.read_text())
              for p in sorted((PACKAGE_DIR / GENERATED).glob("*.json"))}
ALL = [q for doc in DASHBOARDS.values() for q in queries(doc)]
# Incidents, actions and the ledger come from a server seeded with them.
SEEDED = {"aiops-incidents"}
RATE_INTERVAL = "15s"
# What each Infinity column type accepts in the JSON answer (lists: detectors of a cause).
COLUMN_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int, float), "timestamp_epoch": (int,), "string": (str, list),
    "timestamp": (str,)}  # Grafana's $__rate_interval for a 1 s scrape interval, rounded up


def _ids(qs: list[DashboardQuery]) -> list[str]:
    return [f"{q.dashboard}: {q.where}" for q in qs]


PROM = [q for q in ALL if q.is_prometheus]
TELEMETRY = [q for q in ALL if q.is_infinity and q.dashboard not in SEEDED]
INCIDENTS_Q = [q for q in ALL if q.is_infinity and q.dashboard in SEEDED]


def test_every_query_is_covered_below() -> None:
    assert len(PROM) + len(TELEMETRY) + len(INCIDENTS_Q) == len(ALL) > 40
    assert {q.datasource for q in ALL} == {"aiops-prometheus", "aiops-api"}


# -- Prometheus --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(stack: Settings, prometheus: RunningPrometheus) -> Iterator[RunningPrometheus]:
    """Prometheus once it has seen streaming requests (the rarest series: TTFT)."""
    traffic = Traffic(stack.serve_url)
    # Grafana's Infinity panels query the SQL API all the time; here one query stands in.
    assert httpx.post(f"{stack.server_url}/api/v1/sql", json={"sql": "SELECT 1"}).is_success
    try:
        deadline = time.monotonic() + 90
        # Every rate the panels divide by: streaming (TTFT), the LLM's requests, ingest.
        while not prometheus.query_range(
                f"rate(gen_ai_server_time_to_first_token_seconds_count[{RATE_INTERVAL}]) > 0"
                f" and on () sum(rate(aiops_serve_requests_total{{gen_ai_request_model="
                f"'{LLM}'}}[{RATE_INTERVAL}])) > 0"
                " and on () rate(aiops_otlp_rows_total[15s]) > 0", seconds=5, step=1):
            assert time.monotonic() < deadline, "no streaming request reached Prometheus"
            time.sleep(1)
        yield prometheus
    finally:
        traffic.close()


def _variable_values(doc: dict[str, Any], prom: RunningPrometheus) -> dict[str, str]:
    """What Grafana would put in for each variable: the All value, or one real value."""
    values = {}
    for v in variables(doc):
        if v.get("includeAll"):
            values[v["name"]] = v["allValue"]
            continue
        label_values = _label_values(v["query"], prom)
        values[v["name"]] = LLM if LLM in label_values else label_values[0]
    return values


def _label_values(query: str, prom: RunningPrometheus) -> list[str]:
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert m, f"unsupported variable query {query!r}"
    return prom.label_values(m.group(2), m.group(1))


@pytest.mark.parametrize("q", PROM, ids=_ids(PROM))
def test_promql_returns_data(q: DashboardQuery, live: RunningPrometheus) -> None:
    doc = DASHBOARDS[q.dashboard]
    if q.where.startswith("variable"):
        assert _label_values(q.expr, live)
        return
    expr = q.expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in _variable_values(doc, live).items():
        expr = expr.replace(f"${name}", value)
    series = live.query_range(expr)
    values = [float(v) for s in series for _, v in s["values"]]
    assert [v for v in values if v == v], f"no data for {expr}"  # v == v: not NaN


# -- Infinity ------------------------------------------------------------------------------


def _run_infinity(q: DashboardQuery, base_url: str, values: dict[str, str]) -> list[Any]:
    now_ms = int(time.time() * 1000)
    subst = {"${__from}": str(now_ms - 3_600_000), "${__to}": str(now_ms + 60_000),
             **{f"${{{k}}}": v for k, v in values.items()},
             **{f"${k}": v for k, v in values.items()}}

    def fill(text: str) -> str:
        for k in sorted(subst, key=len, reverse=True):
            text = text.replace(k, subst[k])
        return text

    t, options = q.target, q.target["url_options"]
    if options["method"] == "POST":
        resp = httpx.post(base_url + fill(t["url"]), content=fill(options["data"]),
                          headers={"content-type": options["body_content_type"]}, timeout=60)
    else:
        resp = httpx.get(base_url + fill(t["url"]), timeout=60)
    assert resp.status_code == 200, f"{q.where}: {resp.status_code} {resp.text}"
    rows = jsonata.Jsonata(t["root_selector"]).evaluate(resp.json())
    assert isinstance(rows, list) and rows, f"{q.where}: no rows in {resp.text[:500]}"
    declared = {c["selector"] for c in t["columns"]}
    assert declared <= set(rows[0]), f"{q.where}: missing {declared - set(rows[0])}"
    for c in t["columns"]:
        kinds = COLUMN_TYPES[c["type"]]
        assert all(r[c["selector"]] is None or isinstance(r[c["selector"]], kinds)
                   for r in rows), f"{q.where}: column {c['selector']} is not {c['type']}"
    return list(rows)


@pytest.fixture(scope="module")
def telemetry(stack: Settings, live: RunningPrometheus) -> Settings:
    """The stack, once live traffic has reached Prometheus (and so DuckDB)."""
    return stack


@pytest.mark.parametrize("q", TELEMETRY, ids=_ids(TELEMETRY))
def test_infinity_telemetry_query_returns_data(q: DashboardQuery, telemetry: Settings) -> None:
    if "aiops-ebpf" in json.dumps(q.target) and preflight():
        reason = "eBPF collector cannot run here: " + "; ".join(preflight())
        if os.environ.get("AIOPS_REQUIRE_EBPF") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    _run_infinity(q, telemetry.server_url, {"model": LLM})


@pytest.fixture
def seeded(server: RunningServer) -> RunningServer:
    """A server with one open incident, one proposed action and its ledger entry, written
    the way the analyzer and the remediator write them."""
    now = time.time_ns()
    server.store.append("incidents", pa.Table.from_pylist([{
        "incident_id": "inc-test", "opened_at": now - 60 * 10**9, "status": "open",
        "severity": "page", "service": LLM, "model_version": "v2", "fault_class": "latency",
        "summary": "p95 of smollm2 v2 over its objective",
        "evidence": json.dumps({"root_causes": [{
            "entity": f"{LLM}@v2", "fault_class": "latency", "confidence": 0.9, "score": 4.2,
            "detectors": ["slo_burn", "traces"]}]}),
        "updated_at": now - 30 * 10**9}], schema=INCIDENTS.arrow_schema))
    action = {"action_id": "act-test", "incident_id": "inc-test", "created_at": now - 20 * 10**9,
              "kind": "rollback", "target": f"{LLM}@v2", "params": "{}", "mode": "dry_run",
              "status": "dry_run", "outcome": "{}", "updated_at": now - 20 * 10**9}
    server.store.append_many(
        {"actions": pa.Table.from_pylist([action], schema=ACTIONS.arrow_schema)},
        chained={"ledger": [{"time": now - 20 * 10**9, "actor": "policy",
                             "action_id": "act-test", "status": "dry_run",
                             "kind": "rollback", "target": f"{LLM}@v2"}]})
    return server


@pytest.mark.parametrize("q", INCIDENTS_Q, ids=_ids(INCIDENTS_Q))
def test_infinity_incident_query_returns_data(q: DashboardQuery, seeded: RunningServer) -> None:
    rows = _run_infinity(q, seeded.url, {"incident": "inc-test"})
    if q.where == "variable incident":
        assert rows[0]["incident_id"] == "inc-test"

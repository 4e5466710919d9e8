"""The telemetry-question eval: questions asked of the incident fixtures' stores, each answer
checked against figures computed here, in plain Python over the fixture's raw rows (not the
answer's SQL), so a wrong window, filter, percentile or grouping shows.

A question passes when its intent was read right (kind, model, window and what the kind
needs), every figure it states matches the reference, it cites the SQL it ran (none failed),
and where the reference has no data the answer says so instead of stating a figure.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ValidationError

from agents.agent import Agent, Answer
from agents.questions.changes import EDGE, LOOKBACK
from agents.questions.latency import DEFAULT_PERCENTILES
from agents.questions.logs import BASELINE_S, ERROR, WARN
from agents.questions.saturation import MEMORY_QUESTION
from agents.questions.saturation import SHOWN as MEMORY_SHOWN
from agents.questions.spans import column
from agents.tools import Toolbox
from aiops.analytics.logs import mine
from aiops.errors import ConfigError
from aiops.store import Store
from aiops_harness.agent_evals.cases import CASES_DIR, Case, load_case, load_telemetry

__all__ = ["QUESTIONS_FILE", "Question", "QuestionResult", "load_questions", "run_questions"]

QUESTIONS_FILE = Path(__file__).with_name("questions.yaml")
NS = 1_000_000_000
SHOWN = 5


class Expect(BaseModel):
    kind: str
    model: str | None
    minutes: float
    percentiles: list[float] | None = None
    by: str | None = None
    order: str | None = None
    new_only: bool | None = None
    versions: list[str] | None = None


class Question(BaseModel):
    case: str
    question: str
    expect: Expect


@dataclass
class QuestionResult:
    case: str
    question: str
    kind: str
    checks: dict[str, bool]
    answer: Answer
    seconds: float
    why: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


def load_questions(path: Path = QUESTIONS_FILE) -> list[Question]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [Question.model_validate(q) for q in raw["questions"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValidationError) as exc:
        raise ConfigError(f"question fixtures {path}: {exc}") from exc


# -- the fixture's raw rows ------------------------------------------------------------------

def _rows(case: Case, table: str) -> list[dict[str, Any]]:
    path = case.folder / f"{table}.jsonl.gz"
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _attr(r: dict[str, Any], key: str) -> Any:
    return (r.get("attributes") or {}).get(key)


def _res(r: dict[str, Any], key: str) -> Any:
    return (r.get("resource_attributes") or {}).get(key)


def _model(s: dict[str, Any]) -> str | None:
    return _attr(s, "gen_ai.request.model") or (
        s["service_name"] if s.get("service_name") != "ingress" else None)


def _version(s: dict[str, Any]) -> str | None:
    v = _attr(s, "aiops.model.version")
    if v is None and s.get("service_name") != "ingress":
        v = _res(s, "service.version")
    return None if v is None else str(v)


def _replica(s: dict[str, Any]) -> str | None:
    r = _res(s, "ray.serve.replica")
    return None if r is None else str(r)


def _http_status(s: dict[str, Any]) -> int:
    try:
        return int(_attr(s, "http.response.status_code") or 0)
    except (TypeError, ValueError):
        return 0


def _failed(s: dict[str, Any]) -> bool:
    return s.get("status_code") == "error" or _http_status(s) >= 500


class _World:
    """One fixture's raw rows and the question's window."""

    def __init__(self, case: Case, minutes: float) -> None:
        self.case = case
        self.until = case.now_ns
        self.since = self.until - int(minutes * 60 * NS)
        self.spans = _rows(case, "spans")
        self.logs = _rows(case, "logs")
        self.metrics = _rows(case, "metric_points")

    def in_window(self, t: int, since: int | None = None) -> bool:
        return (self.since if since is None else since) < t <= self.until

    def roots(self, model: str | None, version: str | None = None) -> list[dict[str, Any]]:
        return [s for s in self.spans if not s.get("parent_span_id") and _model(s)
                and s.get("kind") == "server"
                and self.in_window(s["start_time"]) and (model is None or _model(s) == model)
                and (version is None or _version(s) == version)]

    def own(self, model: str | None) -> list[dict[str, Any]]:
        return [s for s in self.spans if s.get("service_name") != "ingress"
                and self.in_window(s["start_time"])
                and (model is None or s["service_name"] == model)]


def _pct(durations: Iterable[int], p: float) -> float:
    return round(float(np.percentile(np.array(list(durations), dtype=float), p)) / 1e6, 1)


def _close(a: Any, b: Any, tol: float = 0.051) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= tol


# -- the reference, per kind -----------------------------------------------------------------

def _check_latency(w: _World, a: Answer, why: list[str]) -> bool:
    i, rows = a.intent, a.report.rows if a.report else []
    ps = i.percentiles or DEFAULT_PERCENTILES
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    got: dict[tuple[Any, ...], Any]
    if i.by == "replica":
        for s in w.own(i.model):
            if _replica(s) and (i.version is None or _version(s) == i.version):
                groups[(s["service_name"], _version(s), _replica(s))].append(s["duration_ns"])
        got = {(r["model"], r["version"], r["replica"]): r for r in rows}
    else:
        versioned = i.by == "version" or i.version is not None
        for s in w.roots(i.model, i.version):
            key = (_model(s), _version(s)) if versioned else (_model(s),)
            groups[key].append(s["duration_ns"])
        got = {((r["model"], r["version"]) if versioned else (r["model"],)): r for r in rows}
    return _match_groups(groups, got, ps, why)


def _match_groups(groups: dict[tuple[Any, ...], list[int]], got: dict[tuple[Any, ...], Any],
                  ps: list[float], why: list[str]) -> bool:
    if set(groups) != set(got):
        why.append(f"groups {sorted(map(str, got))} != {sorted(map(str, groups))}")
        return False
    for key, durations in groups.items():
        r = got[key]
        if r["requests"] != len(durations):
            why.append(f"{key}: {r['requests']} requests, expected {len(durations)}")
            return False
        for p in ps:
            if not _close(r[column(p)], _pct(durations, p)):
                why.append(f"{key} p{p:g}: {r[column(p)]} != {_pct(durations, p)}")
                return False
    return True


def _check_compare(w: _World, a: Answer, why: list[str]) -> bool:
    i, rows = a.intent, a.report.rows if a.report else []
    ps = i.percentiles or DEFAULT_PERCENTILES
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for s in w.roots(i.model):
        if _version(s) is not None and (not i.versions or _version(s) in i.versions):
            groups[(_model(s), _version(s))].append(s["duration_ns"])
    got = {(r["model"], r["version"]): r for r in rows}
    return _match_groups(groups, got, ps, why)


def _check_traces(w: _World, a: Answer, why: list[str]) -> bool:
    i = a.intent
    roots = w.roots(i.model, i.version)
    if i.order == "failed":
        roots = sorted((s for s in roots if _failed(s)),
                       key=lambda s: (-s["start_time"], s["trace_id"]))
    else:
        roots = sorted(roots, key=lambda s: (-s["duration_ns"], s["trace_id"]))
    expected = [s["trace_id"] for s in roots[:SHOWN]]
    got = [r["trace_id"] for r in a.report.rows] if a.report else []
    total = a.report.totals.get("matching", 0) if a.report else 0
    if got != expected or total != len(roots):
        why.append(f"traces {got} ({total}) != {expected} ({len(roots)})")
        return False
    return True


def _log_records(w: _World, model: str | None, since: int, until: int, severity: int
                 ) -> list[dict[str, Any]]:
    out = [r for r in w.logs if since < r["time"] <= until
           and (r.get("severity_number") or 0) >= severity and r.get("body") is not None
           and (model is None or r.get("service_name") == model
                or _attr(r, "gen_ai.request.model") == model)]
    return sorted(out, key=lambda r: -r["time"])


def _check_logs(w: _World, a: Answer, why: list[str]) -> bool:
    i = a.intent
    severity = ERROR
    recent = _log_records(w, i.model, w.since, w.until, severity)
    if not recent and not i.new_only:
        severity = WARN
        recent = _log_records(w, i.model, w.since, w.until, severity)
    expected = len(recent)
    if i.new_only and recent:
        before = _log_records(w, i.model, w.since - int(BASELINE_S * NS), w.since, severity)
        templates = mine([r["body"] for r in before] + [r["body"] for r in recent])
        seen = set(templates[:len(before)])
        expected = sum(t not in seen for t in templates[len(before):])
    got = a.report.totals.get("records", 0) if a.report else 0
    if got != expected:
        why.append(f"{got} log records counted, expected {expected}")
        return False
    return True


def _check_changes(w: _World, a: Answer, why: list[str]) -> bool:
    i = a.intent
    lookback = w.since - int(LOOKBACK.total_seconds() * NS)
    scope = [s for s in w.spans if lookback < s["start_time"] <= w.until]
    begins = min((s["start_time"] for s in scope), default=None)
    first: dict[str, int] = {}
    for s in scope:
        if s.get("service_name") == "ingress" or _version(s) is None:
            continue
        if i.model is not None and s["service_name"] != i.model:
            continue
        key = f"{s['service_name']}@{_version(s)}"
        first[key] = min(first.get(key, s["start_time"]), s["start_time"])
    edge = int(EDGE.total_seconds() * NS)
    expected = {k for k, t in first.items()
                if t > w.since and (begins is None or t > begins + edge)}
    rows = a.report.rows if a.report else []
    got = {r["change"].split(" ")[0] for r in rows if "started serving" in r["change"]}
    if got != expected:
        why.append(f"versions started {sorted(got)} != {sorted(expected)}")
        return False
    return True


def _check_saturation(w: _World, a: Answer, why: list[str]) -> bool:
    i = a.intent
    text = a.report.lines if a.report else []
    gauges = any(m["name"] == "aiops.serve.replicas" for m in w.metrics)
    memory_only = MEMORY_QUESTION.search(a.question) is not None  # answered with memory alone
    if not gauges and not memory_only:
        replicas: dict[str, set[str]] = defaultdict(set)
        for s in w.own(i.model):
            if _replica(s):
                replicas[s["service_name"]].add(str(_replica(s)))
        for m, reps in replicas.items():
            line = f"- {m}: {len(reps)} replica(s) answered requests in the window"
            if line not in text:
                why.append(f"missing or wrong: {line!r}")
                return False
    # Replica processes' RSS by deployment: the largest process's latest, the range.
    rss: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for p in w.metrics:
        comp = _attr(p, "Component") or ""
        dep = re.search(r"ServeReplica:[^:]+:(.+)$", comp)
        pid = _attr(p, "pid")
        if p["name"] == "ray_component_rss_mb" and comp.startswith("ray::ServeReplica:") \
                and dep and pid not in (None, "") and w.in_window(p["time"]) \
                and (i.model is None or f":{i.model}-" in comp):
            rss[dep.group(1)][str(pid)].append((p["time"], p["value"]))
    if len(rss) <= MEMORY_SHOWN:
        for dep_name, pids in rss.items():
            largest = max(max(series)[1] for series in pids.values())
            low = min(v for series in pids.values() for _, v in series)
            high = max(v for series in pids.values() for _, v in series)
            head = (f"- {dep_name} memory (RSS, largest of {len(pids)} replica process(es)): "
                    f"{largest:.0f} MB now")
            if not any(line.startswith(head) and f"{low:.0f}-{high:.0f} MB in the window"
                       in line for line in text):
                why.append(f"{dep_name}: RSS {largest:.0f} MB now, {low:.0f}-{high:.0f} MB "
                           "not stated")
                return False
    gaps = a.report.gaps if a.report else []
    if not rss and not any("no replica memory" in g for g in gaps):
        why.append("no RSS in the window, and the answer does not say so")
        return False
    return True


def _check_throughput(w: _World, a: Answer, why: list[str]) -> bool:
    i = a.intent
    versioned = i.by == "version" or i.version is not None
    sums: dict[tuple[Any, ...], int] = defaultdict(int)
    for s in w.own(i.model):
        out = _attr(s, "gen_ai.usage.output_tokens")
        if out is None or (i.version is not None and _version(s) != i.version):
            continue
        key = (s["service_name"], _version(s)) if versioned else (s["service_name"],)
        sums[key] += int(out)
    rows = a.report.rows if a.report else []

    def row_key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model"], r["version"]) if versioned else (r["model"],)

    got = {row_key(r): r["output_tokens"] for r in rows if r.get("output_tokens")}
    if got != {k: v for k, v in sums.items() if v}:
        why.append(f"output tokens {got} != {dict(sums)}")
        return False
    # Requests: each request's root span, as the latency check counts them.
    requests: dict[tuple[Any, ...], int] = defaultdict(int)
    for s in w.roots(i.model, i.version):
        requests[(_model(s), _version(s)) if versioned else (_model(s),)] += 1
    got_requests = {row_key(r): r["requests"] for r in rows if r["requests"]}
    if got_requests != dict(requests):
        why.append(f"requests {got_requests} != {dict(requests)}")
        return False
    return True


def _check_slo(w: _World, a: Answer, why: list[str]) -> bool:
    i, case = a.intent, w.case
    objectives = {o.model: o for o in case.analyzer_objectives()}
    models = [i.model] if i.model else sorted(objectives)
    rows = a.report.rows if a.report else []
    expected = 0
    for m in models:
        o = objectives.get(m)
        if o is None:
            continue
        ingress = [s for s in w.spans if s.get("service_name") == "ingress"
                   and s.get("kind") == "server" and _attr(s, "gen_ai.request.model") == m
                   and w.in_window(s["start_time"])]
        if not ingress:
            continue
        mine_ = [r for r in rows if r["model"] == m]
        bad = []
        if o.latency_ms is not None:
            bad.append(sum(s["duration_ns"] > int(o.latency_ms * 1e6) for s in ingress))
        if o.error_budget is not None:
            bad.append(sum(_http_status(s) >= 500 for s in ingress))
        expected += len(bad)
        if [r["bad"] for r in mine_] != bad or any(r["requests"] != len(ingress)
                                                   for r in mine_):
            why.append(f"{m}: bad {[r['bad'] for r in mine_]} != {bad} of {len(ingress)}")
            return False
    if len(rows) != expected:
        why.append(f"{len(rows)} objective rows, expected {expected}")
        return False
    return True


_CHECKS: dict[str, Callable[[_World, Answer, list[str]], bool]] = {
    "latency": _check_latency, "compare": _check_compare, "traces": _check_traces,
    "logs": _check_logs, "changes": _check_changes, "saturation": _check_saturation,
    "throughput": _check_throughput, "slo": _check_slo}


def _check_intent(q: Question, a: Answer, why: list[str]) -> bool:
    e, i = q.expect, a.intent
    want = {"kind": e.kind, "model": e.model, "minutes": e.minutes}
    have: dict[str, Any] = {"kind": str(i.kind), "model": i.model, "minutes": i.minutes}
    for name in ("percentiles", "by", "order", "new_only", "versions"):
        value = getattr(e, name)
        if value is not None:
            want[name], have[name] = value, getattr(i, name)
    if want != have:
        why.append(f"read as {have}, expected {want}")
        return False
    return True


def score(q: Question, case: Case, answer: Answer) -> tuple[dict[str, bool], list[str]]:
    why: list[str] = []
    checks = {"intent": _check_intent(q, answer, why)}
    if q.expect.kind == "investigate":
        # An investigation's facts are checked by the incident cases
        # (harness/aiops_harness/agent_evals/run.py);
        # here, only that the question was read as one, of the right model and window.
        return checks, why
    r = answer.report
    checks["cites"] = r is not None and bool(r.queries) and all(c.error is None
                                                                for c in r.queries)
    if checks["intent"] and r is not None:
        checks["facts"] = _CHECKS[q.expect.kind](_World(case, q.expect.minutes), answer, why)
        # An empty table comes with the reason (a gap, or a line saying there was none).
        checks["honest"] = bool(r.rows) or bool(r.gaps) or any(
            line.startswith("No ") for line in r.lines)
    else:
        checks["facts"] = False
    return checks, why


def run_questions(questions: list[Question], cases_dir: Path = CASES_DIR,
                  progress: Callable[[QuestionResult], None] | None = None
                  ) -> list[QuestionResult]:
    out = []
    by_case: dict[str, list[Question]] = defaultdict(list)
    for q in questions:
        by_case[q.case].append(q)
    for name, qs in by_case.items():
        case = load_case(cases_dir / name)
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "case.duckdb")
            try:
                load_telemetry(case, store)
                now = case.now_ns
                box = Toolbox(store, now=lambda now=now: now,  # type: ignore[misc]
                              objectives=case.analyzer_objectives())
                for q in qs:
                    started = time.monotonic()
                    answer = Agent(box).ask(q.question)
                    checks, why = score(q, case, answer)
                    result = QuestionResult(case.name, q.question, q.expect.kind, checks,
                                            answer, round(time.monotonic() - started, 3), why)
                    out.append(result)
                    if progress is not None:
                        progress(result)
            finally:
                store.close()
    return out

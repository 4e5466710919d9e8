"""``aiops bench scale``: the correlation and dashboard queries over a store of many spans and
log records (10M + 10M by default; goal p95 <= 100 ms per query).

The store is a real DuckDB file written through :class:`~aiops.store.Store` in time order,
as the server's ingest writes it: ``hours`` of two-span traces (the ingress SERVER span and
the model replica's span) over ``models`` models with two versions each and four replicas
per version, and as many log records (templated bodies, half of them in a trace). In the
last two minutes one model's canary version answers 10x slower: the detection round must
find it, so the queries are timed on data with an incident in it.

The queries are the product's own code paths, each timed ``repetitions`` times:

* ``detect``: one analytics round's trace detector (``trace_findings``: every operation and
  version of the last 10 minutes against its baseline);
* ``evidence``: the incident's cross-signal evidence (``context_evidence``: the logs of its
  traces, the version's serving metric, when it first served);
* ``slis``: the agent's SLIs per version and minute over 15 minutes (``metric_lookup``);
* ``dashboard``: the Serving dashboard's latency percentiles per model and version over the
  last hour (the panel's own SQL);
* ``trace``: one trace's spans by id (``trace_lookup``), a random trace each time: one of the
  last half hour (where an incident's evidence points), or of any age;
* ``logs``: a model's most frequent log messages over 15 minutes (``log_lookup``).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aiops.store import Store
from aiops_harness.bench.common import percentile

__all__ = ["ScaleConfig", "ScaleResult", "build_store", "run_queries", "run_scale"]

NS = 1_000_000_000
MINUTE = 60 * NS
SLOW_FACTOR = 10.0  # the canary's slowdown in the last two minutes

_TEMPLATES = (
    "request served in {n} ms",
    "prompt of {n} tokens admitted to the batch",
    "kv cache at {n} percent",
    "replica heartbeat ok after {n} ms",
    "generated {n} tokens",
    "slow request: {n} ms over the objective",
    "upstream connection reset after {n} ms",
    "backend error: internal error (code {n})",
)
# severities of the templates above: INFO, then WARN, then ERROR
_SEVERITY = (9, 9, 9, 9, 9, 13, 13, 17)


@dataclass(frozen=True)
class ScaleConfig:
    spans: int = 10_000_000
    logs: int = 10_000_000
    hours: float = 24.0
    models: int = 8
    batch_rows: int = 1_000_000
    repetitions: int = 20
    seed: int = 7
    memory_mb: int = 1024  # DuckDB's buffer pool, as the server's default duckdb_memory_mb
    trace_index: bool = False  # the store_trace_index setting


@dataclass
class ScaleResult:
    config: ScaleConfig
    load_s: float
    store_mib: float
    rows: dict[str, int]
    # per query: the latencies of its repetitions (ms)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)  # the detect query's findings
    peak_rss_mib: float = 0.0

    def p(self, query: str, q: float) -> float:
        return percentile(self.latencies_ms[query], q)


def _hex(rng: np.random.Generator, n: int, nbytes: int) -> pa.Array:
    """``n`` random ids of ``nbytes`` bytes as lower-case hex strings, vectorised."""
    raw = rng.integers(0, 256, size=n * nbytes, dtype=np.uint8).tobytes().hex()
    return pa.array(np.frombuffer(raw.encode(), dtype=f"S{2 * nbytes}").astype(str))


def _take(values: list[str], index: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values), pa.array(index))


def _json(*parts: pa.Array | str) -> pa.Array:
    """Concatenate literal pieces and string arrays into one JSON text per row."""
    return pc.binary_join_element_wise(*parts, "")


def _model_names(cfg: ScaleConfig) -> list[str]:
    return [f"model-{i}" for i in range(cfg.models)]


def _spans_batch(cfg: ScaleConfig, rng: np.random.Generator, t0: int, t1: int, traces: int,
                 now_ns: int) -> tuple[pa.Table, pa.Array]:
    names = _model_names(cfg)
    start = np.sort(rng.integers(t0, t1, size=traces))
    model = rng.integers(0, cfg.models, size=traces)
    canary = rng.random(traces) < 0.2
    replica = rng.integers(0, 4, size=traces)
    # per model a typical latency (20 ms to 1 s), lognormal around it
    base_ms = np.geomspace(20, 1000, cfg.models)[model]
    dur = (base_ms * rng.lognormal(0.0, 0.3, size=traces) * 1e6).astype(np.int64)
    slow = canary & (model == 0) & (start > now_ns - 2 * MINUTE)
    dur[slow] = (dur[slow] * SLOW_FACTOR).astype(np.int64)
    failed = rng.random(traces) < 0.01
    trace_id, root, child = _hex(rng, traces, 16), _hex(rng, traces, 8), _hex(rng, traces, 8)
    m = _take(names, model)
    v = pa.array(np.where(canary, "v2", "v1"))
    r = _json(m, "-", v, "-", pa.array(replica.astype(str)))
    status = pa.array(np.where(failed, "500", "200"))
    ingress_attrs = _json('{"gen_ai.request.model": "', m, '", "aiops.model.version": "', v,
                          '", "http.response.status_code": ', status, "}")
    model_attrs = _json('{"gen_ai.request.model": "', m, '", "aiops.model.version": "', v,
                        '"}')
    model_res = _json('{"service.name": "', m, '", "service.version": "', v,
                      '", "ray.serve.replica": "', r, '"}')
    code = pa.array(np.where(failed, "error", "unset"))
    inner = (dur * 0.95).astype(np.int64)
    ts = pa.timestamp("ns")
    ingress = {
        "trace_id": trace_id, "span_id": root, "parent_span_id": pa.nulls(traces, pa.string()),
        "name": pa.array(["POST /v1/chat/completions"] * traces), "kind":
        pa.array(["server"] * traces), "start_time": pa.array(start, ts),
        "end_time": pa.array(start + dur, ts), "duration_ns": pa.array(dur),
        "status_code": code, "service_name": pa.array(["ingress"] * traces),
        "resource_attributes": pa.array(['{"service.name": "ingress"}'] * traces),
        "attributes": ingress_attrs}
    model_span = {
        "trace_id": trace_id, "span_id": child, "parent_span_id": root,
        "name": _json("chat ", m), "kind": pa.array(["internal"] * traces),
        "start_time": pa.array(start + 1_000_000, ts),
        "end_time": pa.array(start + 1_000_000 + inner, ts), "duration_ns": pa.array(inner),
        "status_code": code, "service_name": m, "resource_attributes": model_res,
        "attributes": model_attrs}
    both = pa.concat_tables([pa.table(ingress), pa.table(model_span)])
    order = pc.sort_indices(both, [("end_time", "ascending")])
    return both.take(order), trace_id


def _logs_batch(cfg: ScaleConfig, rng: np.random.Generator, t0: int, t1: int, n: int,
                trace_ids: pa.Array) -> pa.Table:
    names = _model_names(cfg)
    t = np.sort(rng.integers(t0, t1, size=n))
    tpl = rng.integers(0, len(_TEMPLATES), size=n)
    num = rng.integers(1, 5000, size=n).astype(str)
    bodies = [_TEMPLATES[i].format(n=x) for i, x in zip(tpl.tolist(), num.tolist(),
                                                         strict=True)]
    model = rng.integers(0, cfg.models, size=n)
    v = pa.array(np.where(rng.random(n) < 0.2, "v2", "v1"))
    m = _take(names, model)
    traced = rng.random(n) < 0.5
    tid = pc.take(trace_ids, pa.array(rng.integers(0, len(trace_ids), size=n)))
    ts = pa.timestamp("ns")
    return pa.table({
        "time": pa.array(t, ts), "observed_time": pa.array(t, ts),
        "trace_id": pc.if_else(pa.array(traced), tid, pa.nulls(n, pa.string())),
        "severity_number": pa.array(np.array(_SEVERITY)[tpl].astype(np.int32)),
        "body": pa.array(bodies), "service_name": m,
        "resource_attributes": _json('{"service.name": "', m, '", "service.version": "', v,
                                     '"}')})


def build_store(path: Path, cfg: ScaleConfig, now_ns: int,
                progress: Callable[[str], None] = lambda _: None) -> tuple[Store, list[str]]:
    """Write the spans and logs in time order, ``batch_rows`` at a time (one transaction
    each, like the server's flushes). Returns the store and a sample of trace ids."""
    rng = np.random.default_rng(cfg.seed)
    store = Store(path, memory_limit_mb=cfg.memory_mb, trace_index=cfg.trace_index)
    t_begin = now_ns - int(cfg.hours * 3600 * NS)
    batches = max(1, -(-max(cfg.spans, cfg.logs) // cfg.batch_rows))
    edges = np.linspace(t_begin, now_ns, batches + 1).astype(np.int64)
    traces = np.diff(np.linspace(0, cfg.spans // 2, batches + 1).astype(np.int64))
    records = np.diff(np.linspace(0, cfg.logs, batches + 1).astype(np.int64))
    sample: list[str] = []  # trace ids from every batch: any age
    for k in range(batches):
        spans, ids = _spans_batch(cfg, rng, int(edges[k]), int(edges[k + 1]), int(traces[k]),
                                  now_ns)
        logs = _logs_batch(cfg, rng, int(edges[k]), int(edges[k + 1]), int(records[k]), ids)
        store.append_many({"spans": spans, "logs": logs})
        sample += ids.slice(0, 50).to_pylist()
        progress(f"batch {k + 1}/{batches}: {spans.num_rows:,} spans, {logs.num_rows:,} logs")
    return store, sample


def _queries(store: Store, now_ns: int, sample: list[str], rng: np.random.Generator
             ) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """The timed queries, and what the detection round finds (the incident they are about)."""
    from agents.tools import Toolbox
    from aiops.analytics.correlate import context_evidence
    from aiops.analytics.incidents import rank_causes
    from aiops.analytics.traces import TraceThresholds, trace_findings
    from dashboards.infinity import TIME_PARAMS
    from dashboards.serving import latency_percentiles

    tools = Toolbox(store, now=lambda: now_ns)
    recent = [r[0] for r in store.query(
        "SELECT trace_id FROM spans WHERE parent_span_id IS NULL AND start_time > "
        "make_timestamp_ns(?) LIMIT 200", [now_ns - 1800 * NS]).rows]
    thresholds = TraceThresholds(window_s=10)
    found = trace_findings(store, now_ns, thresholds)
    causes = rank_causes(found)
    # The panel's statement as Grafana sends it to /api/v1/sql (the range's two epoch ms
    # first: Grafana writes them into the body unquoted, hence the stand-in before parsing).
    body = latency_percentiles(model_filter=False).fields()["url_options"]["data"]
    for param in TIME_PARAMS:
        body = body.replace(param, "0")
    panel = json.loads(body)["sql"]
    hour_ms = (now_ns - 3600 * NS) // 1_000_000, now_ns // 1_000_000

    def evidence() -> Any:
        return context_evidence(store, causes[0], now_ns) if causes else None

    queries = {
        "detect": lambda: trace_findings(store, now_ns, thresholds),
        "evidence": evidence,
        "slis": lambda: tools.metric_lookup("model-0", 15),
        "dashboard": lambda: store.query(panel, list(hour_ms)),
        "trace (last hour)": lambda: tools.trace_lookup(recent[int(rng.integers(len(recent)))]),
        "trace (any age)": lambda: tools.trace_lookup(sample[int(rng.integers(len(sample)))]),
        "logs": lambda: tools.log_lookup("model-3", 15, min_severity=9),
    }
    return queries, [f"{f.entity} {f.fault_class}" for f in found]


def run_queries(store: Store, now_ns: int, sample: list[str], repetitions: int,
                seed: int = 7) -> tuple[dict[str, list[float]], list[str]]:
    """Time each query ``repetitions`` times (after one untimed run that warms the cache)."""
    rng = np.random.default_rng(seed)
    queries, found = _queries(store, now_ns, sample, rng)
    out: dict[str, list[float]] = {}
    for name, run in queries.items():
        run()
        times = []
        for _ in range(repetitions):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1e3)
        out[name] = times
    return out, found


def run_scale(workdir: Path, cfg: ScaleConfig,
              progress: Callable[[str], None] = lambda _: None) -> ScaleResult:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "scale.duckdb"
    for stale in (path, path.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    now_ns = time.time_ns()
    t = time.perf_counter()
    store, sample = build_store(path, cfg, now_ns, progress)
    load_s = time.perf_counter() - t
    try:
        rows = {name: int(store.query(f"SELECT count(*) FROM {name}").rows[0][0])
                for name in ("spans", "logs")}
        progress("timing the queries")
        latencies, found = run_queries(store, now_ns, sample, cfg.repetitions, cfg.seed)
    finally:
        store.close()
    size = sum(p.stat().st_size for p in workdir.glob("scale.duckdb*"))
    return ScaleResult(cfg, load_s, size / 2**20, rows, latencies, found,
                       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

"""Root-cause ranking over the telemetry tables: which entity, and what kind of fault.

Given an anomaly window and a baseline (the period before it, or a known fault-free period),
every candidate entity -- a service, a replica, a model version: any resource attribute -- is
scored by how far its *own* telemetry moved, in units of its baseline's spread:

* **metrics** (BARO-style): per series, the level the anomaly window held for at least half
  its points, away from the baseline median, over the baseline IQR; the metric's name gives
  the fault class (cpu, memory, network, latency, errors).
* **span times**: per operation, the *exclusive* time of its spans (duration minus children),
  so a slow callee does not make its callers look slow. The time a client span spends beyond
  the server span it caused is network/queueing, charged to the end that all the slow edges
  share: the callee, unless one caller is slow towards several callees or slow itself.
* **span structure**: per execution of an operation, which call follows which (from its
  start to its end), and how often an error starts in it rather than under it (errors are
  charged to the deepest erroring span). An early return or a thrown exception stops the
  calls after that point.
* **log transitions**: the same for log templates (drain3) within one span: which template
  follows which, which one an operation starts with. A path the code always took breaks; a
  new error appears after a known record.
* **crash**: calls that used to reach a callee now get no answer span; an entity's share of
  the log records drops to nothing.
* **mesh edges**: per-edge request latency gauges reported by both ends of a call (Istio's
  labels: ``reporter`` source|destination, ``source_workload``, ``destination_workload``),
  for when there are no traces: the caller's view beyond the callee's is network, charged
  as client-span time is; an edge that is no longer reported while its caller goes on is a
  call the caller's code stopped making.

Counts are compared as rates (per execution, per preceding event) so load and request mix
cancel out, and baseline rates are medians over one-minute buckets so a few disturbed
baseline minutes do not move them. An entity's score is its strongest source (weighted, with
diminishing returns); a caller is discounted when a callee it calls scored as high (the
deepest deviating entity is the likelier cause). The same method and parameters serve every
case; the heavy lifting is vectorised SQL in DuckDB.

One module per evidence source (metrics, mesh, spans, logs), the rates they share, the
scope they read through, and the combiner; ``rank`` here runs them in order.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from aiops.analytics.rca.combine import combine_evidence
from aiops.analytics.rca.logs import log_evidence, log_silence_evidence
from aiops.analytics.rca.mesh import mesh_evidence
from aiops.analytics.rca.metrics import metric_evidence, metric_family
from aiops.analytics.rca.model import (
    Evidence,
    EvidenceKind,
    FaultClass,
    RankConfig,
    RootCause,
    Symptom,
    Window,
)
from aiops.analytics.rca.scope import ConnDb, Db, Scope, StoreDb, entity_sql
from aiops.analytics.rca.spans import span_facts
from aiops.analytics.rca.symptom import symptom_order
from aiops.analytics.topology import ServiceMap
from aiops.store import Store

__all__ = [
    "Evidence",
    "EvidenceKind",
    "FaultClass",
    "RankConfig",
    "RootCause",
    "Symptom",
    "Window",
    "metric_family",
    "rank",
]


def rank(db: Store | duckdb.DuckDBPyConnection, anomaly: Window,
         baseline: Window | Sequence[Window], entity: str = "service.name",
         config: RankConfig | None = None, topology: ServiceMap | None = None,
         symptom: Symptom | None = None, peers: Sequence[Window] = ()) -> list[RootCause]:
    """Rank candidate entities as the root cause of what happened in ``anomaly``.

    ``baseline`` is one or more windows of normal behaviour (they must not overlap the
    anomaly). ``entity`` is the resource attribute that identifies a candidate:
    ``service.name``, ``service.instance.id`` (a replica), ``aiops.model.version`` ...
    Entities without any evidence are not listed. ``topology`` adds declared call edges
    (a service map) to those read off spans, for stacks with few or no traces. ``symptom``:
    the entity whose users saw the fault (the SLO that burns, the node that alarmed); where
    no call was seen in traces (only ``topology``'s), the ranking then starts from it
    (``symptom.symptom_order``). ``peers``: the anomaly windows of the same system's other
    incidents; a metric's move counts only beyond the level it typically holds in them
    (``metrics.metric_evidence``), so what moves with every incident does not outrank the
    cause. Peers that overlap the anomaly window are left out.
    """
    cfg = config or RankConfig()
    base = [baseline] if isinstance(baseline, Window) else list(baseline)
    if not base:
        raise ValueError("rank needs at least one baseline window")
    if any(b.start_ns < anomaly.end_ns and anomaly.start_ns < b.end_ns for b in base):
        raise ValueError("baseline windows must not overlap the anomaly window")
    reader: Db = StoreDb(db) if isinstance(db, Store) else ConnDb(db)
    others = tuple(p for p in peers
                   if not (p.start_ns < anomaly.end_ns and anomaly.start_ns < p.end_ns))
    scope = Scope(anomaly, base, entity_sql(entity), others)
    evidence = metric_evidence(reader, scope, cfg)
    with span_facts(reader, scope, cfg) as spans:
        latency = spans.latency_evidence()
        evidence += latency
        evidence += spans.network_evidence({e.entity for e in latency})
        evidence += spans.structure_evidence()
        evidence += spans.crash_evidence()
        edges = spans.call_edges()
    if entity == "service.name":  # mesh workloads are services, not replicas or versions
        evidence += mesh_evidence(reader, scope, cfg)
    evidence += log_evidence(reader, scope, cfg)
    evidence += log_silence_evidence(reader, scope, cfg)
    # Spans without the attribute take part (their time and calls count) but are nobody.
    calls = {(a, b) for a, b in edges if a and b}
    if topology is not None and entity == "service.name":
        calls |= topology.edges
    evidence = [e for e in evidence if e.entity]
    traced = any(a != b for a, b in calls - (topology.edges if topology else set()))
    # Only a declared graph: roles in it (relays, where the anomaly converges) order what
    # the evidence alone cannot (combine_evidence).
    ranked = combine_evidence(evidence, calls, cfg, roles=topology is not None and not traced)
    if symptom is None or traced:
        # Calls seen in traces: the combiner already tells a cause from the callers that
        # suffer it, span by span, more finely than the walk's anomaly test (Nezha's
        # traced systems lost to the walk: TrainTicket AS@1 0.96 -> 0.57).
        return ranked
    return symptom_order(ranked, symptom, calls, evidence, cfg)


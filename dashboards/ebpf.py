"""eBPF host view: kernel signals per Serve deployment (or process when it is no replica).

The eBPF collector's points are deltas with per-process labels (see docs/ebpf.md), so they are
summed per bucket in SQL rather than re-exposed to Prometheus. Event counters that are usually
zero (OOM kills, retransmits) are summed over all of the collector's points of a bucket, so
that a quiet host shows zeros instead of no data.
"""

from __future__ import annotations

from aiops import semconv
from dashboards.infinity import Column, Infinity
from dashboards.panels import Board, table_panel, timeseries_panel
from dashboards.sql import RANGE, bucket, epoch_ms, in_range

__all__ = ["ebpf"]

EBPF = "service_name = 'aiops-ebpf'"
OWNER = (f"coalesce({semconv.DEPLOYMENT}, "
         "'pid ' || (attributes->>'process.pid') || ' ' || (attributes->>'process.command'), "
         "'host')")
SERIES = [Column("time", "timestamp_epoch"), Column("owner")]


def _per_owner(metric: str, value: str, name: str, top: int = 8) -> Infinity:
    """``value`` per bucket and owner for the ``top`` owners with the largest total."""
    return Infinity.sql(
        f"""{RANGE}, p AS (
          SELECT {bucket('time')} AS time, {OWNER} AS owner, sum(value) AS v, sum(sum) AS s,
                 sum(count) AS n, any_value(r.step_s) AS step_s
          FROM metric_points, r
          WHERE {EBPF} AND name = '{metric}' AND {in_range('time')} GROUP BY ALL),
        top AS (SELECT owner FROM p GROUP BY owner ORDER BY sum(coalesce(s, v)) DESC
                LIMIT {top})
        SELECT time, owner, {value} AS {name} FROM p SEMI JOIN top USING (owner)
        ORDER BY time""",
        [*SERIES, Column(name, "number")]).timeseries()


def _events(columns: dict[str, str]) -> Infinity:
    sums = ", ".join(f"coalesce(sum(value) FILTER (WHERE name = '{metric}'), 0) "
                     f"/ any_value(r.step_s) "
                     f"AS {col}" for col, metric in columns.items())
    return Infinity.sql(
        f"""{RANGE}
        SELECT {bucket('time')} AS time, {sums}
        FROM metric_points, r WHERE {EBPF} AND {in_range('time')}
        GROUP BY ALL ORDER BY time""",
        [Column("time", "timestamp_epoch"), *(Column(c, "number") for c in columns)]
    ).timeseries()


def ebpf() -> Board:
    b = Board("aiops-ebpf", "aiops / eBPF host view",
              "Run-queue, syscall and block I/O latency, TCP and process events from the eBPF "
              "collector, attributed to Serve replicas.", tags=["ebpf"])
    b.row("CPU and syscalls").add(
        timeseries_panel("Run-queue wait per second", "Seconds per second spent runnable but "
                         "waiting for a CPU (top 8 owners).", "s",
                         _per_owner("aiops.ebpf.runq.latency", "s / step_s", "wait_s_per_s")),
        timeseries_panel("Syscall latency (mean)", "Mean syscall latency (one syscall in 8 "
                         "timed per thread; top 8 owners).", "s",
                         _per_owner("aiops.ebpf.syscall.latency", "s / nullif(n, 0)",
                                    "mean_s")),
    )
    b.row("I/O and network").add(
        timeseries_panel("Block I/O latency (mean)", "Mean request latency per disk (last "
                         "submitter as owner).", "s", Infinity.sql(
                             f"""{RANGE}
                             SELECT {bucket('time')} AS time,
                                    coalesce(attributes->>'disk.device', '?') AS device,
                                    sum(sum) / nullif(sum(count), 0) AS mean_s
                             FROM metric_points, r
                             WHERE {EBPF} AND name = 'aiops.ebpf.block.latency'
                               AND {in_range('time')}
                             GROUP BY ALL ORDER BY time""",
                             [Column("time", "timestamp_epoch"), Column("device"),
                              Column("mean_s", "number")]).timeseries()),
        timeseries_panel("TCP events per second", "Retransmits and state changes on the "
                         "host.", "short", _events({
                             "retransmits": "aiops.ebpf.tcp.retransmits",
                             "state_changes": "aiops.ebpf.tcp.state_changes"})),
    )
    b.row("Processes and the collector").add(
        timeseries_panel("Process lifecycle per second", "exec, exit and OOM kills on the "
                         "host.", "short", _events({
                             "execs": "aiops.ebpf.process.execs",
                             "exits": "aiops.ebpf.process.exits",
                             "oom_kills": "aiops.ebpf.oom.kills"})),
        timeseries_panel("Collector cost and drops", "The collector's own CPU seconds per "
                         "second and updates lost to full maps or buffers.", "short", _events({
                             "cpu_s_per_s": "aiops.ebpf.collector.cpu_seconds",
                             "drops_per_s": "aiops.ebpf.collector.drops"})),
        table_panel("Probes", "Whether each probe is attached now (0 with the error when it "
                    "failed).", Infinity.sql(
                        f"""{RANGE}
                        SELECT (attributes->>'probe') AS probe,
                               arg_max(value, time) AS attached,
                               arg_max(attributes->>'error', time) AS error,
                               {epoch_ms('max(time)')} AS last_seen
                        FROM metric_points, r
                        WHERE {EBPF} AND name = 'aiops.ebpf.collector.probe_attached'
                          AND {in_range('time')}
                        GROUP BY ALL ORDER BY probe""",
                        [Column("probe"), Column("attached", "number"), Column("error"),
                         Column("last_seen", "timestamp_epoch")]), height=6),
    )
    return b

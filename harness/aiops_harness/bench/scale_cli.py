"""``aiops bench scale``, ``volume`` and ``phoenix``: what one server holds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from aiops.cli_common import console

__all__ = ["bench_lake", "bench_phoenix", "bench_scale", "bench_volume"]


def bench_scale(
    spans: Annotated[int, typer.Option(min=1000, max=200_000_000, help="Spans to load.")]
    = 10_000_000,
    logs: Annotated[int, typer.Option(min=1000, max=200_000_000, help="Log records.")]
    = 10_000_000,
    hours: Annotated[float, typer.Option(min=0.1, max=24 * 30, help="Time they span.")] = 24,
    repetitions: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    trace_index: Annotated[bool, typer.Option(help="With the store_trace_index setting's "
                                              "ART index on spans.trace_id.")] = False,
    workdir: Annotated[Path, typer.Option(help="Where the store is written.")]
    = Path(".aiops/bench/scale"),
) -> None:
    """The correlation and dashboard queries over a store of SPANS spans and LOGS log
    records: p50/p95 per query (goal p95 <= 100 ms), load rate, store size, peak RSS."""
    from aiops_harness.bench.scale import ScaleConfig, run_scale

    cfg = ScaleConfig(spans=spans, logs=logs, hours=hours, repetitions=repetitions,
                      trace_index=trace_index)
    r = run_scale(workdir, cfg, progress=console.log)
    t = Table("query", "p50 ms", "p95 ms", "p95 <= 100 ms",
              title=f"scale: {r.rows['spans']:,} spans + {r.rows['logs']:,} logs over "
                    f"{hours:g} h, {repetitions} runs each"
                    f"{', trace index' if trace_index else ''}")
    for name in r.latencies_ms:
        p95 = r.p(name, 95)
        t.add_row(name, f"{r.p(name, 50):.1f}", f"{p95:.1f}", "yes" if p95 <= 100 else "NO")
    console.print(t)
    total = r.rows["spans"] + r.rows["logs"]
    console.print(f"load: {r.load_s:.0f} s ({total / r.load_s:,.0f} rows/s); store "
                  f"{r.store_mib:,.0f} MiB ({r.store_mib * 2**20 / total:.0f} B/row); peak "
                  f"RSS {r.peak_rss_mib:,.0f} MiB; detect found: {', '.join(r.found) or 'nothing'}")


def bench_phoenix(
    venv: Annotated[Path, typer.Option(help="Virtualenv with arize-phoenix installed "
                                      "(make phoenix-env).")] = Path(".venv-phoenix"),
    requests: Annotated[int, typer.Option(min=1, max=10_000,
                                          help="Distinct pre-encoded requests.")] = 20,
    spans_per_request: Annotated[int, typer.Option(min=1, max=10_000)] = 1000,
    clients: Annotated[int, typer.Option(min=1, max=64)] = 4,
    storage: Annotated[str, typer.Option(
        help="Phoenix's storage: sqlite (its default) or postgresql (its production setup: a "
             "throwaway PostgreSQL on loopback, on the other core).")] = "sqlite",
) -> None:
    """Span ingest beside Arize Phoenix's OTLP receiver: the same requests into each, spans
    stored per second and peak RSS, as ratios."""
    if storage not in ("sqlite", "postgresql"):
        raise typer.BadParameter("sqlite or postgresql", param_hint="--storage")
    from aiops_harness.bench.phoenix import run_phoenix

    r = run_phoenix(venv, requests, spans_per_request, clients,
                    storage="postgresql" if storage == "postgresql" else "sqlite")
    t = Table("figure", "aiops", f"Phoenix {r.phoenix_version} ({r.storage})",
              "aiops / Phoenix",
              title=f"ingest beside Phoenix: {r.aiops.spans:,} spans, {clients} clients, "
                    "each server on 1 core")
    t.add_row("spans stored per second", f"{r.aiops.stored_per_s:,.0f}",
              f"{r.phoenix.stored_per_s:,.0f}", f"{r.ratio:.2f}x")
    t.add_row("seconds until the last answer", f"{r.aiops.accepted_s:.2f}",
              f"{r.phoenix.accepted_s:.2f}", "")
    t.add_row("seconds until every span is stored", f"{r.aiops.stored_s:.2f}",
              f"{r.phoenix.stored_s:.2f}", "")
    t.add_row("server peak RSS (MiB)", f"{r.aiops.peak_rss_mib:,.0f}",
              f"{r.phoenix.peak_rss_mib:,.0f}",
              f"{r.aiops.peak_rss_mib / r.phoenix.peak_rss_mib:.2f}x")
    console.print(t)


def bench_volume(
    nodes: Annotated[int, typer.Option(min=1, max=1000, help="Serving nodes.")] = 100,
    replicas_per_node: Annotated[int, typer.Option(min=1, max=64)] = 8,
    requests_per_s: Annotated[float, typer.Option(min=0.1, max=100,
                                                  help="Requests/s per replica.")] = 2.0,
    seconds: Annotated[int, typer.Option(min=5, max=3600, help="How long to send.")] = 60,
    workdir: Annotated[Path, typer.Option(help="Where the server's store is written.")]
    = Path(".aiops/bench/volume"),
) -> None:
    """A cluster's telemetry live into one server (on one core, analytics on): per node one
    trace and one log request a second, 3 spans and 2 log records per request; rows stored,
    refusals, the server's CPU and RSS, its analytics rounds and a dashboard panel's latency
    under that load."""
    from aiops_harness.bench.volume import VolumeConfig, run_volume, summary

    cfg = VolumeConfig(nodes, replicas_per_node, requests_per_s, seconds)
    r = run_volume(workdir, cfg, progress=console.log)
    t = Table("figure", "value", title=f"volume: {seconds} s of a {nodes}-node cluster's "
                                       "telemetry into one server")
    for k, v in summary(r).items():
        t.add_row(k, v)
    console.print(t)


def bench_lake(
    rows: Annotated[int, typer.Option(min=100_000, max=1_000_000_000,
                                      help="Spans + logs in the lake for the queries.")]
    = 100_000_000,
    ingest_rows: Annotated[int, typer.Option(min=10_000, max=100_000_000,
                                             help="Rows each store writes in the ingest runs.")]
    = 3_000_000,
    repetitions: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    small_commits: Annotated[int, typer.Option(min=2, max=100_000,
                                               help="Commits before the timed upkeep.")] = 300,
    workdir: Annotated[Path, typer.Option(help="Where the lake and stores are written.")]
    = Path(".aiops/bench/lake"),
) -> None:
    """Telemetry in DuckLake (a throwaway PostgreSQL catalog): ingest by one store and by
    two side by side (each on its own core), `aiops bench scale`'s queries over ROWS rows in
    the lake (p50/p95, goal p95 <= 100 ms), bytes per row, the upkeep's cost."""
    from aiops_harness.bench.lake import LakeBenchConfig, run_lake

    cfg = LakeBenchConfig(rows=rows, ingest_rows=ingest_rows, repetitions=repetitions,
                          small_commits=small_commits)
    r = run_lake(workdir, cfg, progress=console.log)
    t = Table("ingest run", "rows/s into the lake", "vs one store without a lake",
              title=f"lake ingest: {ingest_rows:,} rows per store, commits every "
                    f"{cfg.commit_interval_s:g} s")
    base = r.ingest.get("one store, no lake", 0.0)
    for name, rate in r.ingest.items():
        t.add_row(name, f"{rate:,.0f}", f"{rate / base:.2f}x" if base else "-")
    console.print(t)
    q = Table("query", "p50 ms", "p95 ms", "p95 <= 100 ms",
              title=f"queries over the lake: {r.lake_rows:,} rows, {repetitions} runs each")
    for name in r.latencies_ms:
        p95 = r.p(name, 95)
        q.add_row(name, f"{r.p(name, 50):.1f}", f"{p95:.1f}", "yes" if p95 <= 100 else "NO")
    console.print(q)
    console.print(f"lake filled in {r.fill_s:.0f} s ({r.lake_rows / max(r.fill_s, 1e-9):,.0f} "
                  f"rows/s); Parquet {r.parquet_bytes / 2**20:,.0f} MiB "
                  f"({r.parquet_bytes / max(r.lake_rows, 1):.1f} B/row); upkeep after "
                  f"{small_commits} small commits {r.upkeep_s:.2f} s (files "
                  f"{r.files_before} -> {r.files_after}); detect found: "
                  f"{', '.join(r.found) or 'nothing'}")

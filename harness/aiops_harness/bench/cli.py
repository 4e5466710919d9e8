"""``aiops bench ...``: the benchmarks (figures in docs/benchmarks.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from aiops.cli_common import console, err_console, fail
from aiops.errors import AIOpsError
from aiops_harness.bench.scale_cli import bench_lake, bench_phoenix, bench_scale, bench_volume
from aiops_harness.datasets import datasets

__all__ = ["app"]

# Harness: ``aiops.cli`` mounts it from the entry point of harness/pyproject.toml and imports
# it only when it is invoked.
app = typer.Typer(name="bench", no_args_is_help=True, add_completion=False,
                  help="Benchmarks (figures in docs/benchmarks.md).")
bench_app = app
_fail = fail
bench_app.command("scale")(bench_scale)
bench_app.command("lake")(bench_lake)
bench_app.command("phoenix")(bench_phoenix)
bench_app.command("volume")(bench_volume)



@bench_app.command("ingest")
def bench_ingest(
    spans_per_request: Annotated[int, typer.Option(help="Spans in one OTLP request.")] = 1000,
    requests: Annotated[int, typer.Option(help="Distinct pre-encoded requests.")] = 20,
    rounds: Annotated[int, typer.Option(help="Times each request is replayed.")] = 5,
    clients: Annotated[int, typer.Option(help="Concurrent client threads.")] = 4,
) -> None:
    """OTLP spans and logs over HTTP and gRPC (the same requests) into DuckDB, beside the
    store's own append rates."""
    from aiops_harness.bench.ingest import run_ingest

    r = run_ingest(requests, spans_per_request, rounds, clients)
    t = Table("figure", "value", title=f"ingest: {r.spans:,} spans, {clients} clients")
    core = " (server on 1 core)" if r.pinned else ""
    t.add_row(f"OTLP/HTTP protobuf spans -> DuckDB (spans/s){core}", f"{r.http_spans_per_s:,.0f}")
    t.add_row(f"OTLP/HTTP protobuf logs -> DuckDB (records/s){core}",
              f"{r.http_logs_per_s:,.0f}")
    t.add_row(f"OTLP/gRPC spans -> DuckDB (spans/s){core}", f"{r.grpc_spans_per_s:,.0f}")
    t.add_row(f"OTLP/gRPC logs -> DuckDB (records/s){core}", f"{r.grpc_logs_per_s:,.0f}")
    t.add_row("server peak RSS (MiB)", f"{r.server_peak_rss_mib:,.0f}")
    t.add_row("store: Arrow batch append (rows/s)", f"{r.arrow_append_rows_per_s:,.0f}")
    t.add_row("peer: DuckDB executemany (rows/s)", f"{r.executemany_rows_per_s:,.0f}")
    ratio = r.arrow_append_rows_per_s / r.executemany_rows_per_s
    t.add_row("Arrow / executemany", f"{ratio:,.0f}x")
    console.print(t)


@bench_app.command("serve")
def bench_serve(
    latency_samples: Annotated[int, typer.Option(help="Requests per path.")] = 400,
    chat_requests: Annotated[int, typer.Option(help="Chat requests per side.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="max_tokens per chat request.")] = 96,
) -> None:
    """Tokens/s full stack vs in-process; latency added over a bare Serve deployment."""
    from aiops_harness.bench.serving import run_serving

    r = run_serving(latency_samples, chat_requests, max_tokens)
    t = Table("figure", "aiops", "peer", "ratio / delta",
              title=f"serve: {chat_requests} chat requests, {latency_samples} echo requests")
    t.add_row("chat tokens/s (stack vs in-process)", f"{r.stack_tokens_per_s:,.1f}",
              f"{r.inprocess_tokens_per_s:,.1f}",
              f"{r.stack_tokens_per_s / r.inprocess_tokens_per_s:.2f}x")
    t.add_row("p50 latency ms (aiops vs bare Serve)", f"{r.aiops_p50_ms:.2f}",
              f"{r.bare_p50_ms:.2f}", f"+{r.aiops_p50_ms - r.bare_p50_ms:.2f} ms")
    t.add_row("p99 latency ms (aiops vs bare Serve)", f"{r.aiops_p99_ms:.2f}",
              f"{r.bare_p99_ms:.2f}", f"+{r.aiops_p99_ms - r.bare_p99_ms:.2f} ms")
    t.add_row("p50 latency ms (aiops vs bare Serve+FastAPI)", f"{r.aiops_p50_ms:.2f}",
              f"{r.fastapi_p50_ms:.2f}", f"+{r.aiops_p50_ms - r.fastapi_p50_ms:.2f} ms")
    t.add_row("p99 latency ms (aiops vs bare Serve+FastAPI)", f"{r.aiops_p99_ms:.2f}",
              f"{r.fastapi_p99_ms:.2f}", f"+{r.aiops_p99_ms - r.fastapi_p99_ms:.2f} ms")
    cost = 1 - r.provenance_on_rps / r.provenance_off_rps
    t.add_row("echo req/s, provenance ledger on vs off", f"{r.provenance_on_rps:,.1f}",
              f"{r.provenance_off_rps:,.1f}", f"cost {cost:+.1%}")
    console.print(t)


@bench_app.command("qos")
def bench_qos(
    duration: Annotated[float | None, typer.Option(
        help="Seconds of open-loop load per row (default 20; 30 with --chat).")] = None,
    levels: Annotated[str, typer.Option(
        help="Batch arrival rates as multiples of capacity, comma-separated (0: realtime "
             "alone).")] = "0,0.5,1,2",
    realtime_rps: Annotated[float | None, typer.Option(
        help="Realtime requests per second (default 5; 0.5 with --chat).")] = None,
    seed: Annotated[int | None, typer.Option(
        help="Poisson arrivals from this seed (default: evenly spaced).")] = None,
    max_ongoing: Annotated[int | None, typer.Option(
        help="Override the model's max_ongoing_requests on both paths (a diagnostic).")
    ] = None,
    batch_max_in_flight: Annotated[int | None, typer.Option(
        help="Set the model's qos.batch_max_in_flight on aiops' path.")] = None,
    quick: Annotated[bool, typer.Option(
        help="A smoke run: levels 0 and 1, 3 s per row (10 s with --chat).")] = False,
    high_throughput: Annotated[bool, typer.Option(
        help="Both paths behind HAProxy with gRPC between replicas (Ray Serve's "
             "high-throughput mode) instead of Serve's Python proxy.")] = False,
    chat: Annotated[str | None, typer.Option(
        help="Measure the chat model's realtime time to first token under batch streams "
             "instead, on this backend: llama_cpp or vllm.")] = None,
    vllm_python: Annotated[Path, typer.Option(
        help="The interpreter vLLM runs in (--chat vllm; `make vllm-env` builds it).")
    ] = Path(".venv-vllm/bin/python"),
) -> None:
    """Realtime latency and batch throughput under a batch flood: aiops' priority classes vs
    the same with priority off vs a plain Serve FIFO deployment, on the embedding model (or,
    with --chat, realtime time to first token of the chat model)."""
    from aiops_harness.bench.qos import render, run_qos

    try:
        parsed = [float(x) for x in levels.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter("numbers separated by commas", param_hint="--levels"
                                 ) from None
    if chat is not None:
        from aiops_harness.bench.qos_chat import BACKENDS, chat_spec, run_qos_chat

        if chat not in BACKENDS:
            raise typer.BadParameter(f"one of {', '.join(BACKENDS)}", param_hint="--chat")
        try:
            chat_spec(chat, vllm_python)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--vllm-python") from None
        if quick:
            parsed, duration = [0.0, 1.0], 10.0
        typer.echo(render(run_qos_chat(
            chat, parsed, duration or 30.0, realtime_rps or 0.5, vllm_python=vllm_python,
            batch_max_in_flight=batch_max_in_flight, max_ongoing_requests=max_ongoing,
            high_throughput=high_throughput)))
        return
    if quick:
        parsed, duration = [0.0, 1.0], 3.0
    typer.echo(render(run_qos(parsed, duration or 20.0, realtime_rps or 5.0, seed=seed,
                              max_ongoing_requests=max_ongoing,
                              batch_max_in_flight=batch_max_in_flight,
                              high_throughput=high_throughput)))


@bench_app.command("ebpf")
def bench_ebpf(
    syscalls: Annotated[int, typer.Option(help="Syscalls per timed loop.")] = 2_000_000,
    rounds: Annotated[int, typer.Option(help="Off/on rounds (medians reported).")] = 3,
    workload_s: Annotated[float, typer.Option(help="Seconds of mixed traffic.")] = 30.0,
) -> None:
    """Per-syscall cost with tracing on vs off; the collector's CPU share under load (root)."""
    from aiops_harness.bench.ebpf import run_ebpf

    try:
        r = run_ebpf(syscalls, rounds, workload_s)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("ns per call", "tracing off", "empty programs", "tracing on", "ratio on/off",
              title=f"ebpf: {syscalls:,} syscalls x {rounds} rounds; "
                    f"{r.requests} requests in {workload_s:.0f} s")
    for name, c in r.syscalls.items():
        t.add_row(name, f"{c.off_ns:.0f}", f"{c.floor_ns:.0f} ({c.floor_ratio:.2f}x)",
                  f"{c.on_ns:.0f}", f"{c.ratio:.2f}x")
    console.print(t)
    cores = os.cpu_count() or 1
    console.print(f"collector CPU under the mixed workload: {r.collector_cpu_share:.2%} of one "
                  f"core, {r.collector_cpu_share / cores:.2%} of this machine ({cores} cores)")


@bench_app.command("mttr")
def bench_mttr(runs: Annotated[int, typer.Option(help="Fault/recovery cycles.")] = 3) -> None:
    """Canary latency fault -> detected -> rolled back -> SLI recovered, on the embedded stack."""
    from aiops_harness.bench.mttr import run_mttr

    try:
        r = run_mttr(runs)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("run", "detected (s)", "rolled back (s)", "recovered (s)",
              title="mttr: seconds from the faulty canary taking traffic")
    for i, run in enumerate(r.runs, 1):
        t.add_row(str(i), f"{run.detected_s:.1f}", f"{run.acted_s:.1f}",
                  f"{run.recovered_s:.1f}")
    t.add_row("median", f"{r.median('detected_s'):.1f}", f"{r.median('acted_s'):.1f}",
              f"{r.median('recovered_s'):.1f}")
    console.print(t)


@bench_app.command("attach")
def bench_attach(
        runs: Annotated[int, typer.Option(min=0, max=20, help="Bad releases rolled back.")] = 3,
        soak_minutes: Annotated[float, typer.Option(
            min=0, max=24 * 60, help="Healthy minutes after the runs (0: none).")] = 0,
        noise: Annotated[bool, typer.Option(
            help="A neighbour process taking 50-100% of a core in bursts throughout, and the "
                 "proxies' spans exported too.")] = False) -> None:
    """A composed Serve app aiops did not start (zero code in it): bad releases of one
    deployment (in place through user_config, then new replicas through runtime_env)
    detected, rolled back through Serve's REST API and verified, at the default settings;
    then a soak with benign changes."""
    _attach_report(runs, soak_minutes, noise)


def _attach_report(runs: int, soak_minutes: float, noise: bool) -> None:
    from aiops_harness.bench.attach import run_attach

    try:
        r = run_attach(runs, soak_minutes, noise=noise, progress=console.log)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    except (RuntimeError, AssertionError) as exc:  # the cluster or a wait failed
        raise _fail(AIOpsError(f"attach bench: {exc}")) from exc
    console.print("settings (defaults): " + ", ".join(f"{k}={v:g}"
                                                      for k, v in r.settings.items())
                  + f"; noisy neighbour and proxy spans: {'on' if noise else 'off'}")
    t = Table("run", "release", "incident", "detected (s)", "clients healthy (s)",
              "last failure -> verified (s)", "failed requests",
              title="attach: seconds from `serve deploy` of the bad release")
    for i, run in enumerate(r.runs, 1):
        t.add_row(str(i), run.release, run.incident, f"{run.detected_s:.1f}",
                  f"{run.healthy_s:.1f}", f"{run.verified_after_s:.1f}",
                  str(run.failed_requests))
    console.print(t)
    if r.soak_minutes:
        console.print(f"soak: {r.soak_minutes:g} min of healthy releases, "
                      f"{r.soak_requests} requests ({r.soak_failed} failed), "
                      f"{len(r.soak_changes)} benign changes: {len(r.soak_incidents)} "
                      f"incident(s) opened, {r.pages_per_week:.0f} pages per week")
        for line in r.soak_changes:
            console.print(f"  change at {line}")
        for line in r.soak_incidents:
            console.print(f"  {line}")


@bench_app.command("warmup")
def bench_warmup(
    repetitions: Annotated[int, typer.Option(min=1, help="New replicas per model and "
                                                         "version.")] = 5,
    model: Annotated[list[str] | None, typer.Option(
        help="chat and/or embedding (repeatable); default both.")] = None,
) -> None:
    """First request on a new replica with the spec's warm-up hook off vs on (real models)."""
    from aiops_harness.bench.warmup import MODELS, run_warmup

    kinds = tuple(model or MODELS)
    unknown = set(kinds) - set(MODELS)
    if unknown:
        raise _fail(AIOpsError(f"unknown model kind(s) {sorted(unknown)}; "
                               f"known: {', '.join(MODELS)}"))
    try:
        r = run_warmup(repetitions, kinds, progress=err_console.print)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("model", "p50 first request ms (cold / warm)", "cold / warm",
              "p50 first request, model span ms (cold / warm)",
              "p50 next request ms (cold / warm)", "in process: p50 first / second inference ms",
              title=f"warmup: first request on a new replica, {repetitions} replicas each")
    for kind in kinds:
        cold, warm = (r.p50(kind, v, "first_ms") for v in ("cold", "warm"))
        span_cold, span_warm = (r.p50(kind, v, "first_span_ms") for v in ("cold", "warm"))
        nxt = r.p50(kind, "cold", "second_ms"), r.p50(kind, "warm", "second_ms")
        first, second = r.engine_p50(kind)
        t.add_row(MODELS[kind]["name"], f"{cold:,.1f} / {warm:,.1f}", f"{cold / warm:.2f}x",
                  f"{span_cold:,.1f} / {span_warm:,.1f}", f"{nxt[0]:,.1f} / {nxt[1]:,.1f}",
                  f"{first:,.1f} / {second:,.1f}")
    console.print(t)


DETECTION_DIR = Path(".aiops/bench/detection")
KeepOption = Annotated[Path, typer.Option(help="Where the runs' telemetry stores are kept "
                                               "(for `aiops bench detection`).")]


@bench_app.command("demo")
def bench_demo(scenario: Annotated[str, typer.Option(help="A scenario, or all.")] = "canary",
               runs: Annotated[int, typer.Option(min=1, max=20, help="Demo runs.")] = 3,
               keep: KeepOption = DETECTION_DIR) -> None:
    """`aiops demo` at the default settings, several times: MTTD, time to recovered and the
    attribution of every scenario (goals: MTTD <= 15 s, recovered <= 30 s)."""
    from aiops.config import load_settings
    from aiops_harness.bench.detection import demo_runs
    from aiops_harness.demo.scenarios import ORDER, SCENARIOS

    names = list(ORDER) if scenario == "all" else [scenario]
    if any(n not in SCENARIOS for n in names):
        raise _fail(AIOpsError(f"unknown scenario {scenario!r}: {', '.join(SCENARIOS)} or all"))
    results = demo_runs(load_settings(), names, runs, keep, progress=console.log)
    t = Table("run", "scenario", "attributed", "action", "MTTD s", "recovered s",
              title=f"demo at the defaults, {runs} run(s)")
    for i, run in enumerate(results, 1):
        for r in run:
            t.add_row(str(i), r.scenario, "yes" if r.attributed else "[red]no",
                      r.action, f"{r.mttd_s:.1f}" if r.mttd_s is not None else "-",
                      f"{r.ttr_s:.1f}" if r.ttr_s is not None else "-")
    console.print(t)
    flat = [r for run in results for r in run]
    ok = [r for r in flat if r.ok and (r.mttd_s or 99) <= 15 and (r.ttr_s or 99) <= 30]
    console.print(f"{len(ok)} of {len(flat)} incidents detected within 15 s, attributed and "
                  "recovered within 30 s")


@bench_app.command("soak")
def bench_soak(minutes: Annotated[float, typer.Option(min=0.5, max=24 * 60,
                                                      help="Healthy minutes.")] = 30,
               keep: KeepOption = DETECTION_DIR,
               attach: Annotated[bool, typer.Option(
                   help="A team's composed Serve app aiops attaches to (the attach bench's), "
                        "three bad releases first, then the soak with benign changes: good "
                        "releases, a scale up and down, traffic 0.5x-2x.")] = False,
               noise: Annotated[bool, typer.Option(
                   help="With --attach: a neighbour process taking 50-100% of a core in "
                        "bursts throughout.")] = False) -> None:
    """The demo's stack and mixed traffic with no fault: incidents opened are false alarms
    (goal: 0 in 30 minutes). With --attach, a team's app at the default settings: every
    incident of the soak is a false page (goal 0), the three bad releases before it must
    each be detected and rolled back."""
    if attach:
        _attach_report(3, minutes, noise)
        return
    from aiops.config import load_settings
    from aiops_harness.bench.detection import soak

    r = soak(load_settings(), minutes, keep, progress=console.log)
    console.print(f"soak: {r.minutes:g} min healthy after a {45:.0f} s warm-up, "
                  f"{r.requests} requests ({r.failed_requests} failed): "
                  f"{len(r.incidents)} incident(s) opened ({r.per_hour:.1f} per hour); "
                  f"{len(r.warmup_incidents)} during the warm-up")
    for line in r.incidents + [f"(warm-up) {w}" for w in r.warmup_incidents]:
        console.print(f"  {line}")


@bench_app.command("detection")
def bench_detection(keep: KeepOption = DETECTION_DIR,
                    soak_minutes: Annotated[float, typer.Option(
                        min=1, help="Minutes of the soak to replay per setting.")] = 10) -> None:
    """MTTD against false incidents per hour for the detector settings tried, replayed over
    the stores `aiops bench demo` and `aiops bench soak` kept."""
    from aiops.config import load_settings
    from aiops_harness.bench.detection import sweep

    rows = sweep(keep, load_settings(), soak_minutes, progress=console.log)
    scenarios = sorted({k for r in rows for k in r.mttd_s})
    minutes = max((r.soak_minutes for r in rows), default=0)
    t = Table("setting", *(f"{s} MTTD s (replayed)" for s in scenarios),
              f"false incidents / hour (first {minutes:g} min of the soak)",
              title="detection trade-off (\">N\": not before the live run's fix at N s)")

    def cell(mttd: float | None, fixed: float | None) -> str:
        if mttd is not None:
            return f"{mttd:.1f}"
        return f">{fixed:.0f}" if fixed is not None else "-"

    for r in rows:
        cells = [" / ".join(cell(*v) for v in r.mttd_s.get(s, [])) for s in scenarios]
        t.add_row(r.setting, *cells,
                  "-" if r.false_per_hour is None else f"{r.false_per_hour:.1f}")
    console.print(t)


@bench_app.command("chatops")
def bench_chatops(
    phase_s: Annotated[float, typer.Option(help="Seconds per phase.")] = 30.0,
    rounds: Annotated[int, typer.Option(help="Rounds of the three phases, pooled.")] = 3,
) -> None:
    """Users' chat latency with no agent calls, with the agent on their model, and with the
    agent on its own replica (aiops-agent)."""
    from aiops_harness.bench.chatops import run_chatops

    try:
        r = run_chatops(phase_s, rounds)
    except AIOpsError as exc:
        raise _fail(exc) from exc
    t = Table("agent narratives", "users p50 ms", "users p95 ms", "user requests",
              "narratives", "s per narrative",
              title=f"chatops: 2 users' chat requests, {r.rounds} rounds of "
                    f"{r.phase_s:.0f} s per phase")
    for p in r.phases:
        t.add_row(p.name, f"{p.p50_ms:.0f}", f"{p.p95_ms:.0f}",
                  f"{len(p.user_ms)} (+{p.user_errors} failed)", str(p.narratives),
                  f"{p.narrative_mean_s:.1f}" if p.narratives else "-")
    console.print(t)
    base = r.phases[0].p95_ms
    console.print("users' p95 vs no agent calls: " + ", ".join(
        f"{p.name} {p.p95_ms / base:.2f}x" for p in r.phases[1:]))


@bench_app.command("memory")
def bench_memory() -> None:
    """Incident memory, leave one out over the agent's incident fixtures: how often a
    fixture's nearest remembered incident (same fault class) is the same kind of failure."""
    from agents.memory import MIN_SCORE
    from aiops_harness.agent_evals.cases import load_cases
    from aiops_harness.agent_evals.memory import run_memory_eval

    r = run_memory_eval(load_cases())
    n = len(r.items)
    t = Table("figure", "value", title=f"memory: {n} fixture incidents, each recalled with "
                                       "itself left out")
    t.add_row(f"a past incident above the similarity floor ({MIN_SCORE})",
              f"{r.recalled:.1%}")
    t.add_row("nearest has the same fault class",
              f"{r.rate(lambda a, b: a.fault_class == b.fault_class):.1%}")
    t.add_row("nearest is the same scenario family",
              f"{r.rate(lambda a, b: a.family == b.family):.1%}")
    console.print(t)


@bench_app.command("durability")
def bench_durability(
    rounds: Annotated[int, typer.Option(help="Ingest rounds, each ended by SIGKILL.")] = 5,
    seconds: Annotated[float, typer.Option(help="Seconds of ingest before each kill.")] = 6.0,
    spans_per_request: Annotated[int, typer.Option(help="Spans in one request.")] = 2000,
    read_timeout_s: Annotated[float, typer.Option(help="Server's ingest read deadline.")] = 10.0,
    attack_s: Annotated[float, typer.Option(help="Seconds of exports beside slow uploads.")]
    = 15.0,
) -> None:
    """Acknowledged spans across kill -9 restarts; overload past a small ingest budget; slow
    uploads announcing big bodies."""
    from aiops_harness.bench.durability import run_durability, run_overload, run_slow_upload, tally

    d = run_durability(rounds, seconds, 4, spans_per_request)
    t = Table("figure", "value", title=f"durability: {rounds} rounds of 4 clients, SIGKILL "
                                       f"after {seconds:g} s, restart on the same data")
    t.add_row("spans acknowledged (HTTP 200)", f"{d.acked_spans:,}")
    t.add_row("acknowledged spans lost", f"{d.lost:,}")
    t.add_row("spans/s during the rounds", f"{d.spans_per_s:,.0f}")
    console.print(t)
    o = run_overload()
    t = Table("figure", "value", title="overload: 8 MiB ingest budget, 64 MiB DuckDB, 8 clients "
                                       f"x 25 requests of {o.request_bytes / 2**20:.2f} MiB")
    t.add_row("200 / 503 / other", tally(o.statuses))
    t.add_row("Retry-After on every 503", str(o.retry_after_on_every_503))
    t.add_row("aiops_ingest_buffer_peak_bytes (MiB)", f"{o.buffer_peak_bytes / 2**20:.2f}")
    t.add_row("server RSS growth, VmHWM - baseline (MiB)", f"{o.rss_growth_mib:.0f}")
    t.add_row("a small export right after", str(o.status_after))
    console.print(t)
    s = run_slow_upload(read_timeout_s, attack_s)
    t = Table("figure", "value", title=f"slow uploads: 2 announcing {s.announced_bytes:,} bytes, "
                                       f"10 sent; 4 clients exporting for {attack_s:g} s")
    t.add_row("valid exports 200 / 503 / other", tally(s.statuses))
    for i, (head, after) in enumerate(s.cut_off, 1):
        t.add_row(f"slow upload {i} (read deadline {read_timeout_s:g} s)",
                  f"{head} after {after:.1f} s")
    console.print(t)


@bench_app.command("attacks")
def bench_attacks() -> None:
    """The door-policy audit's attacks (P27) rerun against a real server: the server's RSS,
    its answers, a bystander's export and /readyz afterwards."""
    from functools import partial

    from aiops_harness.bench.attacks import connection_flood, grpc_stall, remote_write_bomb

    for attack in (grpc_stall, partial(grpc_stall, admitted=True), remote_write_bomb,
                   connection_flood):
        r = attack()
        t = Table("figure", "value", title=r.name)
        t.add_row("server RSS before / peak / after (MB)",
                  f"{r.rss_before_mb:.0f} / {r.rss_peak_mb:.0f} / {r.rss_after_mb:.0f}")
        for k, v in r.answers.items():
            t.add_row(f"answers: {k}", str(v))
        for note in r.notes:
            t.add_row("", note)
        t.add_row("a bystander's export meanwhile", r.bystander)
        t.add_row("/readyz afterwards", str(r.ready_after))
        console.print(t)


DATASETS = datasets()
DatasetsOption = Annotated[Path, typer.Option(
    help="Root of the public corpora (nezha/, rcd_sockshop/, loghub2k/, nab/, published/).")]


@bench_app.command("rca")
def bench_rca(datasets: DatasetsOption = DATASETS) -> None:
    """Root-cause ranking: Nezha (AS@1/3/5 per system), RCD Sock Shop (Avg@5), each also
    symptom-led from the entry service, and PetShop (recall@1/3 per issue metric, with and
    without the symptom, beside the published anomaly traversal)."""
    from aiops_harness.evals import nezha, petshop, sockshop

    _need(datasets / "nezha", datasets / "rcd_sockshop", datasets / "petshop")
    published = datasets / "published"
    console.print(nezha.render(nezha.run_nezha(datasets / "nezha"),
                               published / "nezha_fse23_table3_table4.csv"))
    led = nezha.run_nezha(datasets / "nezha", symptoms=nezha.ENTRY)
    console.print("Symptom-led from each system's entry service: " + ", ".join(
        f"{system} AS@1/3/5 {100 * r.at(1):.2f}/{100 * r.at(3):.2f}/{100 * r.at(5):.2f}"
        for system, r in led.systems.items()))
    console.print(sockshop.render(sockshop.run_sockshop(datasets / "rcd_sockshop"),
                                  published / "rcaeval_ase24_table5_avg5.csv"))
    ss_led = sockshop.run_sockshop(datasets / "rcd_sockshop", symptom=sockshop.ENTRY)
    console.print(f"Symptom-led from {sockshop.ENTRY.entity}: Avg@5 CPU "
                  f"{ss_led.avg5('cpu'):.2f}, MEM {ss_led.avg5('mem'):.2f}")
    for scenario in sorted(p.name for p in (datasets / "petshop" / "dataset").iterdir()
                           if (p / "graph.csv").is_file()):
        folder = datasets / "petshop" / "dataset" / scenario
        console.print(f"PetShop, {scenario}:")
        console.print(petshop.render(
            [petshop.run_petshop(folder, symptom_led=led, peers=peers)
             for peers in (False, True) for led in (False, True)],
            petshop.published(published / "petshop_notebook_traversal_baseline.csv",
                              scenario)))


@bench_app.command("topology")
def bench_topology(datasets: DatasetsOption = DATASETS) -> None:
    """Root-cause ranking without traces: Nezha metrics-only with no topology and with the
    declared service map, beside all signals; Sock Shop (metrics only) with and without it."""
    from rich.table import Table

    from aiops.analytics.topology import load_service_map
    from aiops_harness.evals import nezha, sockshop

    _need(datasets / "nezha", datasets / "rcd_sockshop")
    maps = {system: load_service_map(path) for system, path in nezha.SERVICE_MAPS.items()}
    runs = [("all signals", nezha.ALL_SIGNALS, None), ("metrics only", frozenset({"metrics"}),
                                                       None),
            ("metrics only + service map", frozenset({"metrics"}), maps)]
    t = Table("corpus", "system", "signals / topology", "cases", "AS@1", "AS@3", "AS@5")
    for label, signals, topologies in runs:
        report = nezha.run_nezha(datasets / "nezha", signals=signals, topologies=topologies)
        for system, rep in report.systems.items():
            if topologies is not None and system not in topologies:
                continue  # no declared map for this system: the run above is the figure
            t.add_row("Nezha", system, label, str(len(rep.results)),
                      *(f"{100 * rep.at(k):.1f}" for k in (1, 3, 5)))
    for label, topology in (("metrics (the corpus has no traces)", None),
                            ("metrics + service map",
                             load_service_map(sockshop.SERVICE_MAP))):
        ss = sockshop.run_sockshop(datasets / "rcd_sockshop", topology=topology)
        t.add_row("RCD Sock Shop", "Sock Shop", label, str(len(ss.results)),
                  *(f"{100 * ss.ac(k):.1f}" for k in (1, 3, 5)))
    console.print(t)


@bench_app.command("logs")
def bench_logs(datasets: DatasetsOption = DATASETS,
               loso: Annotated[bool, typer.Option(
                   help="Also run the leave-one-system-out protocol (the figures that speak "
                        "for unseen systems; about half a minute).")] = True,
               slices: Annotated[str, typer.Option(
                   help="Also mine each system in slices of these many lines (comma-separated, "
                        "e.g. 200,500; empty: none): fewer lines per template, where "
                        "over-splitting shows.")] = "") -> None:
    """Log parsing on Loghub-2.0 2k: GA and PA per system at the frozen defaults, beside Drain's
    published rows; then each system held out, scored with the setting chosen on the others."""
    from aiops_harness.evals.loghub import (
        PUBLISHED_FILE,
        render,
        render_slices,
        run_loghub,
        run_slices,
    )

    _need(datasets / "loghub2k")
    try:
        sizes = [int(x) for x in slices.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"--slices takes line counts such as 200,500, not {slices!r}") from None
    if any(n < 2 for n in sizes):
        raise typer.BadParameter("--slices: each slice needs at least 2 lines")
    published = datasets / "published" / PUBLISHED_FILE
    console.print(render(run_loghub(datasets / "loghub2k", published)))
    if sizes:
        console.print(render_slices(run_slices(datasets / "loghub2k", sizes)))
    if loso:
        from aiops_harness.evals.loghub_loso import describe, render_loso, run_loso

        report = run_loso(datasets / "loghub2k", published)
        console.print(render_loso(report))
        console.print(describe(report), markup=False, highlight=False)


@bench_app.command("anomaly")
def bench_anomaly(
    datasets: DatasetsOption = DATASETS,
    cache: Annotated[Path | None, typer.Option(
        help="Folder to cache each method's raw NAB scores in (reruns skip streaming).")] = None,
) -> None:
    """Streaming metric anomaly detection on NAB (standard, low-FP, low-FN profiles), beside
    the reference detectors re-scored from their saved outputs and the published scoreboard;
    then leave-one-category-out selection of the live detector, beside the windowed Gaussian."""
    from aiops_harness.evals.nab import render, run_nab
    from aiops_harness.evals.nab_loco import render_loco, run_loco

    _need(datasets / "nab")
    console.print(render(run_nab(datasets / "nab")))
    console.print("\nLeave one NAB category out (chosen on the other six by NAB standard):")
    console.print(render_loco(run_loco(datasets / "nab", cache_dir=cache)), markup=False,
                  soft_wrap=True)


@bench_app.command("transfer")
def bench_transfer(
    datasets: DatasetsOption = DATASETS,
    cache: Annotated[Path | None, typer.Option(
        help="Folder to cache each method's raw scores in (reruns skip streaming).")] = None,
) -> None:
    """The metric detector chosen on NAB, scored on the cloud_kpi families it was never
    chosen on; leave one cloud_kpi family out; beside the windowed Gaussian."""
    from aiops_harness.evals.detector_transfer import render, run_transfer

    _need(datasets / "nab", datasets / "cloud_kpi")
    report = run_transfer(datasets / "nab", datasets / "cloud_kpi" / "data", cache_dir=cache)
    console.print(render(report), markup=False, soft_wrap=True)


@bench_app.command("detector-choice")
def bench_detector_choice(
    datasets: DatasetsOption = DATASETS,
    cache: Annotated[Path | None, typer.Option(
        help="Folder to cache each method's raw scores in (reruns skip streaming).")] = None,
) -> None:
    """The live metric detector chosen by pooled event F1 with whole corpora held out (NAB <->
    cloud_kpi, and one family / category out inside each), beside the windowed Gaussian chosen
    the same way; then the choice on both corpora (the shipped default)."""
    from aiops_harness.evals.detector_choice import render, run_choice

    _need(datasets / "nab", datasets / "cloud_kpi")
    report = run_choice(datasets / "nab", datasets / "cloud_kpi" / "data", cache_dir=cache)
    console.print(render(report), markup=False, soft_wrap=True)


def _need(*folders: Path) -> None:
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        err_console.print(f"[red]error:[/red] corpus folder(s) not found: {', '.join(missing)} "
                          "(pass --datasets)")
        raise typer.Exit(2)


@bench_app.command("all")
def bench_all() -> None:
    """Every benchmark with its defaults (what `make bench` runs)."""
    bench_ingest()
    bench_serve()
    from collectors.ebpf.collector import preflight

    if preflight():
        console.print("ebpf: skipped: " + "; ".join(preflight()))
    else:
        bench_ebpf()
    bench_mttr()
    bench_attach()
    bench_warmup()
    bench_chatops()
    bench_memory()
    bench_durability()
    bench_attacks()
    bench_scale()
    bench_volume()
    if (Path(".venv-phoenix") / "bin" / "phoenix").exists():
        bench_phoenix()
    else:
        console.print("phoenix: skipped: no .venv-phoenix (make phoenix-env)")
    if (DATASETS / "nezha").is_dir():
        bench_rca()
        bench_topology()
        bench_logs()
        bench_anomaly()
    else:
        console.print(f"rca, logs: skipped: no corpora at {DATASETS}")

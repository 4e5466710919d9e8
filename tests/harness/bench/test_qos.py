"""`aiops bench qos`: the open-loop schedule, the per-class summary and the report table (no
Ray); and one tiny run over the real stack."""

from __future__ import annotations

import math

import pytest

from aiops_harness.bench.qos import (
    AIOPS,
    AIOPS_OFF,
    BATCH,
    CONFIGS,
    FIFO,
    REALTIME,
    Breakdown,
    ClassStats,
    QosReport,
    QosRow,
    Sample,
    render,
    run_qos,
    schedule,
    summarize,
)


def test_an_even_schedule_sends_at_the_rate_from_the_offset() -> None:
    assert schedule(4.0, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert schedule(2.0, 2.0, offset_s=0.25) == [0.25, 0.75, 1.25, 1.75]
    assert len(schedule(50.0, 20.0)) == 1000
    assert schedule(0.0, 10.0) == [] and schedule(5.0, 0.0) == []


def test_a_poisson_schedule_is_deterministic_inside_the_window_at_about_the_rate() -> None:
    a, b = schedule(100.0, 20.0, seed=7), schedule(100.0, 20.0, seed=7)
    assert a == b and a != schedule(100.0, 20.0, seed=8)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 20.0
    assert 1800 < len(a) < 2200


def test_the_summary_counts_per_class_and_takes_percentiles_of_answered_requests() -> None:
    samples = [Sample(REALTIME, 200, float(ms), ms / 1000) for ms in range(1, 101)]
    samples += [Sample(REALTIME, 429, 1.0, 0.1), Sample(REALTIME, 0, 60_000.0, 61.0, 250.0)]
    samples += [Sample(BATCH, 200, 500.0, t) for t in (1.0, 2.0, 9.0, 12.0)]
    samples += [Sample(BATCH, 429, 2.0, 1.0)] * 3 + [Sample(BATCH, 503, 5.0, 1.0)]
    rt = summarize(samples, REALTIME, 10.0)
    assert (rt.sent, rt.ok, rt.shed, rt.errors) == (102, 100, 1, 1)
    assert (rt.p50_ms, rt.p95_ms, rt.p99_ms) == (51.0, 95.0, 99.0)
    assert rt.send_lag_p99_ms == 0.0  # 1 late of 102
    lags = [Sample(BATCH, 200, 1.0, 1.0, float(ms)) for ms in range(101)]
    assert summarize(lags, BATCH, 10.0).send_lag_p99_ms == 99.0
    b = summarize(samples, BATCH, 10.0)
    assert (b.sent, b.ok, b.shed, b.errors) == (8, 4, 3, 1)
    assert b.throughput_rps == pytest.approx(0.3)  # the one done after 10 s does not count
    none = summarize([Sample(BATCH, 429, 1.0, 1.0)], BATCH, 10.0)
    assert math.isnan(none.p99_ms) and none.throughput_rps == 0.0


def _stats(p99: float, rps: float = 0.0, shed: int = 0) -> ClassStats:
    return ClassStats(sent=100, ok=100 - shed, shed=shed, errors=0, p50_ms=p99 / 2,
                      p95_ms=p99 * 0.9, p99_ms=p99, throughput_rps=rps)


def test_the_table_has_a_row_per_level_and_config_with_the_goal_checks() -> None:
    rows = [QosRow(c, 0.0, 0.0, _stats(40.0), _stats(float("nan"))) for c in CONFIGS]
    rows += [QosRow(AIOPS, 2.0, 100.0, _stats(50.0), _stats(700.0, 45.0, shed=30)),
             QosRow(AIOPS_OFF, 2.0, 100.0, _stats(900.0), _stats(900.0, 44.0, shed=40)),
             QosRow(FIFO, 2.0, 100.0, _stats(3000.0), _stats(3000.0, 50.0))]
    report = QosReport("minilm-l6-v2", 8, 1, 64, 20.0, 5.0,
                       {AIOPS: 50.0, FIFO: 48.0}, rows)
    assert report.unloaded_p99_ms(AIOPS) == 40.0 and report.row(FIFO, 1.0) is None
    table = render(report)
    lines = table.splitlines()
    assert "capacity (closed loop): aiops 50.0 req/s, serve FIFO 48.0 req/s" in lines[0]
    body = [line for line in lines if line.startswith("| 0x") or line.startswith("| 2x")]
    assert len(body) == 6 and all(line.count("|") == 12 for line in body)
    aiops_2x = next(line for line in body if line.startswith("| 2x | 100.0 | aiops |"))
    assert "25 / 45 / 50" in aiops_2x and "30 / 0 of 100" in aiops_2x
    assert "p99 ok, 1.2x unloaded, batch 0.90x FIFO" in aiops_2x
    off_2x = next(line for line in body if f"| {AIOPS_OFF} |" in line and "2x" in line)
    assert "p99 > 120, 22.5x unloaded, batch 0.88x FIFO" in off_2x
    fifo_0x = next(line for line in body if line.startswith(f"| 0x | 0.0 | {FIFO} |"))
    assert "| - / - |" in fifo_0x and fifo_0x.endswith("| p99 ok | 0 | 0 |")



def test_the_realtime_breakdown_follows_the_table_for_aiops_rows_only() -> None:
    spans = Breakdown(spans=99, ingress_p50_ms=30.0, ingress_p99_ms=90.0, model_p50_ms=12.0,
                      model_p99_ms=40.0)
    rows = [QosRow(AIOPS, 1.0, 50.0, _stats(100.0), _stats(200.0, 45.0), breakdown=spans),
            QosRow(FIFO, 1.0, 50.0, _stats(100.0), _stats(200.0, 50.0))]
    lines = render(QosReport("minilm-l6-v2", 8, 1, 64, 20.0, 5.0, {AIOPS: 50.0}, rows)
                   ).splitlines()
    split = [line for line in lines if line.startswith("| 1x | 99 |")]
    # client p50 50 ms, of it 30 in the ingress's span: 20 outside it.
    assert split == ["| 1x | 99 | 50 / 100 | 30 / 90 | 12 / 40 | 20 |"]


@pytest.mark.stack
def test_a_tiny_run_reports_every_level_and_config() -> None:
    report = run_qos(levels=(0.0, 1.0), duration_s=2.0, capacity_s=2.0, timeout_s=30.0)
    assert {(r.config, r.level) for r in report.rows} == {
        (c, lv) for c in CONFIGS for lv in (0.0, 1.0)}
    assert set(report.capacity_rps) == {AIOPS, FIFO}
    assert all(v > 0 for v in report.capacity_rps.values())
    for r in report.rows:
        assert r.realtime.sent == 10 and r.realtime.ok > 0
        assert (r.batch.sent == 0) == (r.level == 0)
        # aiops' path names each request's class on its span: where the time went.
        assert (r.breakdown is not None and r.breakdown.spans > 0) == (r.config == AIOPS)
        # who used the cores: the load generator's processes, and the path's own replicas
        assert r.cpu["load generator"] > 0
        assert r.cpu["aiops model" if r.config != FIFO else "FIFO model"] > 0
    rendered = render(report).splitlines()
    table = [line for line in rendered if any(f"| {c} |" in line for c in CONFIGS)]
    assert sum(1 for line in table if line.startswith(("| 0x", "| 1x"))) == 12  # + cores
    assert "Serve's Python proxy" in rendered[0]

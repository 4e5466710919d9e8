"""`aiops bench volume`: a cluster's telemetry live into a real server; every row sent is
stored, and the figures come from the server itself (its CPU, RSS, /metrics, SQL API)."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from aiops_harness.bench.volume import VolumeConfig, encode_second, run_volume, summary

NS = 1_000_000_000


def test_a_node_second_is_three_spans_and_two_logs_per_request_in_that_second() -> None:
    cfg = VolumeConfig(nodes=1, replicas_per_node=4, requests_per_s=2.5)
    traces, logs = encode_second(cfg, 3, 10 * NS)
    t, lg = ExportTraceServiceRequest(), ExportLogsServiceRequest()
    t.ParseFromString(traces)
    lg.ParseFromString(logs)
    spans = [s for rs in t.resource_spans for ss in rs.scope_spans for s in ss.spans]
    records = [r for rl in lg.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    assert cfg.requests_per_node_s == 10
    assert len(spans) == 30 and len(records) == 20
    assert all(10 * NS <= s.start_time_unix_nano < 11 * NS for s in spans)
    assert len({s.trace_id for s in spans}) == 10
    assert sum(1 for s in spans if not s.parent_span_id) == 10  # one ingress root each


@pytest.mark.slow
def test_every_row_sent_is_stored_and_the_server_reports_its_own_cost(tmp_path: Path) -> None:
    cfg = VolumeConfig(nodes=3, replicas_per_node=2, requests_per_s=2, seconds=6, clients=2)
    r = run_volume(tmp_path, cfg)
    assert r.sent_rows == cfg.rows_per_s * 6 == 360
    assert r.stored_rows == r.sent_rows and r.refused == 0 and r.failed == 0
    assert 0 < r.server_cpu_share < 1.5 and r.server_peak_rss_mib > 50
    assert r.analytics_rounds >= 1 and r.panel_ms
    assert "360 of 360" in summary(r)["rows stored of sent"]

"""`aiops bench qos --chat`: the chat specs each backend is measured with, how a streamed
answer's first token is recognised, and the TTFT table (no Ray; the run itself is a benchmark,
its figures in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiops_harness.bench.qos import AIOPS, CONFIGS, FIFO, ClassStats, QosReport, QosRow, render
from aiops_harness.bench.qos_chat import chat_spec, first_token


def _stats(p99: float, rps: float = 0.0) -> ClassStats:
    return ClassStats(sent=20, ok=20, shed=0, errors=0, p50_ms=p99 / 2, p95_ms=p99 * 0.9,
                      p99_ms=p99, throughput_rps=rps)


def _chunk(content: str | None) -> str:
    delta = {} if content is None else {"content": content}
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})


def test_the_first_token_is_the_first_chunk_with_text() -> None:
    assert first_token(_chunk("Hello"))
    assert not first_token(_chunk(""))  # the role-only opening chunk
    assert not first_token(_chunk(None))
    assert not first_token("data: [DONE]")
    assert not first_token(": keep-alive") and not first_token("data: {not json")
    assert not first_token("")


def test_llama_cpp_is_measured_on_one_replica_with_a_slot_kept_for_realtime() -> None:
    spec = chat_spec("llama_cpp")
    assert spec.backend == "llama_cpp" and spec.autoscaling.max_replicas == 1
    # One batch request in the replica (its batch context), the other slot for realtime.
    assert spec.max_ongoing_requests == 2 and spec.qos.batch_max_in_flight == 1
    assert spec.options.get("realtime_context", True)
    assert chat_spec("llama_cpp", batch_max_in_flight=2).qos.batch_max_in_flight == 2


def test_vllm_needs_its_interpreter_and_orders_by_priority_itself(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="make vllm-env"):
        chat_spec("vllm", tmp_path / "missing" / "python")
    python = tmp_path / "python"
    python.write_text("")
    spec = chat_spec("vllm", python)
    assert spec.backend == "vllm" and spec.python == python.absolute()
    # Five slots, four for batch: a realtime request always reaches the engine, whose
    # priority policy then schedules it first.
    assert spec.max_ongoing_requests == 5 and spec.qos.batch_max_in_flight == 4
    narrower = chat_spec("vllm", python, max_ongoing_requests=4)  # the kept slot follows
    assert narrower.max_ongoing_requests == 4 and narrower.qos.batch_max_in_flight == 3
    assert spec.resources.num_cpus == 0.5  # both paths' replicas fit the bench's 2 CPUs
    # A virtualenv's python is a link to the base interpreter: the link is what is run.
    link = tmp_path / "venv-python"
    link.symlink_to(python)
    assert chat_spec("vllm", link).python == link
    with pytest.raises(ValueError, match="known: llama_cpp, vllm"):
        chat_spec("onnx_embedding")


def test_the_chat_table_is_of_ttft_with_no_absolute_goal() -> None:
    rows = [QosRow(c, 0.0, 0.0, _stats(400.0), _stats(float("nan"))) for c in CONFIGS]
    rows += [QosRow(AIOPS, 1.0, 0.8, _stats(500.0), _stats(2000.0, 0.7)),
             QosRow(FIFO, 1.0, 0.8, _stats(3000.0), _stats(3000.0, 0.8))]
    table = render(QosReport("smollm2-135m-instruct (llama_cpp)", 2, 1, 16, 30.0, 0.5,
                             {AIOPS: 0.8, FIFO: 0.8}, rows, metric="TTFT", p99_goal_ms=None))
    assert "realtime TTFT p50 / p95 / p99 (ms)" in table and "batch TTFT p50 / p99" in table
    aiops_1x = next(line for line in table.splitlines() if line.startswith("| 1x | 0.8 | aiops"))
    assert "| 1.2x unloaded, batch 0.87x FIFO |" in aiops_1x
    assert "p99 ok" not in table and "p99 >" not in table

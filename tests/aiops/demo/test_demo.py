"""The main job, headless: `aiops demo`'s default scenario end to end on the real stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from aiops.bench.common import free_port
from aiops.config import Settings
from aiops.demo.runner import demo_settings, run_demo
from aiops.stack import read_state

pytestmark = pytest.mark.stack


def test_the_default_scenario_detects_attributes_rolls_back_recovers_and_reports(
        tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path / "data", server_port=free_port(),
                    serve_port=free_port(), control_port=free_port(),
                    ray_metrics_port=free_port())
    settings = demo_settings(base)
    console = Console(record=True, width=120)
    [r] = run_demo(settings, console, ["canary"], tmp_path / "reports", headless=True)

    assert r.incident is not None and r.attributed, r.incident
    assert (r.incident["service"], r.incident["model_version"]) == ("smollm2-135m-instruct",
                                                                    "v2")
    assert r.action is not None and (r.action["kind"], r.action["mode"]) == ("rollback",
                                                                             "auto")
    assert r.action["status"] in ("executed", "verified"), r.action
    assert r.mttd_s is not None and r.mttd_s < 90
    assert r.resolved_at is not None and r.ttr_s is not None and not r.problems

    answer = r.answer
    assert answer is not None and answer["facts"]["incident_id"] == r.incident["incident_id"]
    traces = [e["id"] for e in answer["evidence"] if e["kind"] == "trace"]
    assert traces and traces[0] in answer["text"]

    [folder] = (tmp_path / "reports").iterdir()
    report = (folder / "report.md").read_text()
    assert r.incident["incident_id"] in report and "rollback" in report
    assert (folder / "slis.png").stat().st_size > 10_000
    assert json.loads((folder / "report.json").read_text())[0]["attributed"] is True

    assert read_state(settings) == []  # everything it started is stopped

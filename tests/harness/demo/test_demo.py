"""The main job, headless: `aiops demo`'s default scenario end to end on the real stack."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from aiops.config import Settings
from aiops.stack import read_state
from aiops_harness.bench.common import free_port
from aiops_harness.demo.runner import ScenarioResult, demo_settings, run_demo
from aiops_harness.demo.scenarios import ORDER
from aiops_harness.demo.traffic import CHAT, EMBED, VISION, Workload

# `make test` runs these on their own, after the rest of the suite: with the session's stack
# (its Ray, its eBPF collector) sharing the 2 cores, the chat model's stable version queued
# past its SLO after the rollback and the rollback's verification failed (CI failed so).
pytestmark = [pytest.mark.stack, pytest.mark.alone]
# Their limits are about 4x what they take on a quiet machine (160, 340 and 120 s), so a hung
# run fails here with its traceback instead of running CI past its 90 minutes.

# The demo's own mix at about two thirds of its rates: the test runner shares the 2 cores
# with the demo's stack, and at the full rates the chat model's stable version queued past
# its SLO before any fault (a saturated machine is an incident of its own). `aiops demo`
# and `aiops bench demo` run the full rates.
TRAFFIC = (Workload("chat", CHAT, 0.9), Workload("stream", CHAT, 0.45),
           Workload("embed", EMBED, 1.0), Workload("image", VISION, 0.05))


def _settings(tmp_path: Path) -> Settings:
    return demo_settings(Settings(data_dir=tmp_path / "data", server_port=free_port(),
                                  serve_port=free_port(), control_port=free_port(),
                                  ray_metrics_port=free_port()))


@dataclass
class AllScenarios:
    settings: Settings
    results: list[ScenarioResult]
    reports: Path


@pytest.fixture(scope="module")
def every_scenario(tmp_path_factory: pytest.TempPathFactory) -> AllScenarios:
    """`aiops demo --scenario all`, run once for the tests below (one stack, not one per test):
    a slow canary (the default scenario, first), CPU burn, a memory leak, a crash loop and an
    error burst, one after another."""
    tmp_path = tmp_path_factory.mktemp("demo")
    settings = _settings(tmp_path)
    results = run_demo(settings, Console(record=True, width=120), list(ORDER),
                       tmp_path / "reports", headless=True, workloads=TRAFFIC)
    return AllScenarios(settings, results, tmp_path / "reports")


@pytest.mark.timeout(1200)
def test_the_default_scenario_detects_attributes_rolls_back_recovers_and_reports(
        every_scenario: AllScenarios) -> None:
    r = every_scenario.results[0]
    assert r.scenario.name == "canary"  # ORDER starts with the default scenario
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

    [folder] = every_scenario.reports.iterdir()
    report = (folder / "report.md").read_text()
    assert r.incident["incident_id"] in report and "rollback" in report
    assert (folder / "slis.png").stat().st_size > 10_000
    assert json.loads((folder / "report.json").read_text())[0]["attributed"] is True

    assert read_state(every_scenario.settings) == []  # everything it started is stopped


@pytest.mark.timeout(1200)
def test_every_scenario_is_detected_attributed_to_its_component_and_class_and_recovers(
        every_scenario: AllScenarios) -> None:
    """Each scenario is the incident of the right model version with the right fault class by
    the time it is acted on, and each recovers."""
    results = every_scenario.results
    assert [r.scenario.name for r in results] == list(ORDER)
    for r in results:
        inc = r.incident or {}
        assert r.attributed, (r.scenario.name, inc.get("fault_class"), inc.get("service"),
                              inc.get("model_version"), inc.get("summary"))
        assert r.mttd_s is not None and r.resolved_at is not None and r.ttr_s is not None, \
            (r.scenario.name, r.problems)
        assert not r.problems, (r.scenario.name, r.problems)
    by_name = {r.scenario.name: r for r in results}
    for canary in ("canary", "error-burst"):
        act = by_name[canary].action
        assert act is not None and act["kind"] == "rollback" and act["status"] in (
            "executed", "verified"), (canary, act)
    assert read_state(every_scenario.settings) == []

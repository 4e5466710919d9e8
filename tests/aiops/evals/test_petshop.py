"""The root-cause ranker on the PetShop RCA dataset (a cloud app seen through per-node
latency / availability / request statistics and a declared call graph, no traces), from the
node that alarmed. Floors are what the ranker achieves, less a small margin, and never below
the published anomaly traversal on the issue metric where it is ahead."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiops.evals.petshop import PetShopReport, issues, load_graph, published, run_petshop

DATASETS = Path(__file__).resolve().parents[3].parent / "shared" / "datasets"
LOW = DATASETS / "petshop" / "dataset" / "low_traffic"
PUBLISHED = DATASETS / "published" / "petshop_notebook_traversal_baseline.csv"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (LOW / "graph.csv").is_file(),
    reason=f"the PetShop corpus is not at {LOW} (../shared/datasets/petshop from the repo root)")]


@pytest.fixture(scope="module")
def reports() -> tuple[PetShopReport, PetShopReport]:
    return run_petshop(LOW, symptom_led=False), run_petshop(LOW)


def test_every_issue_is_ranked_over_the_declared_graph() -> None:
    assert len(issues(LOW)) == 26
    assert len(load_graph(LOW / "graph.csv").edges) >= 40


def test_from_the_symptom_latency_issues_beat_the_published_traversal(
        reports: tuple[PetShopReport, PetShopReport]) -> None:
    plain, led = reports
    r1, r3 = published(PUBLISHED, "low_traffic")["latency"]  # 0.571, 0.571
    # 0.643 and 0.929 here (without the symptom: 0.500 and 0.857).
    assert led.recall(1, "latency") >= r1 and led.recall(3, "latency") >= r3
    assert led.recall(1, "latency") > plain.recall(1, "latency")


def test_availability_issues_are_in_the_top_three(
        reports: tuple[PetShopReport, PetShopReport]) -> None:
    _, led = reports
    # 0.667 and 1.000 here; the published traversal: 0.833 and 1.000 (docs/benchmarks.md says
    # which issues miss: a load balancer's client-side node ties with the service behind it).
    assert led.recall(3, "availability") >= published(PUBLISHED, "low_traffic")[
        "availability"][1]
    assert led.recall(1, "availability") >= 0.6

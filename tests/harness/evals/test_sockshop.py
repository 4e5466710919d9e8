"""The root-cause ranker on RCD's Sock Shop cases (CPU and memory faults, metrics only),
scored with RCAEval's Avg@5. Floors are what the ranker achieves, less a small margin."""

from __future__ import annotations

import pytest

from aiops_harness.datasets import DATASETS as HARNESS_DATASETS
from aiops_harness.evals.sockshop import SockShopReport, cases, render, run_sockshop

DATASETS = HARNESS_DATASETS
SOCKSHOP = DATASETS / "rcd_sockshop"
PUBLISHED = DATASETS / "published" / "rcaeval_ase24_table5_avg5.csv"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (SOCKSHOP / "sock-shop-data").is_dir(),
    reason=f"the RCD Sock Shop corpus is not at {SOCKSHOP} "
           "(../shared/datasets/rcd_sockshop from the repo root)")]


@pytest.fixture(scope="module")
def report() -> SockShopReport:
    return run_sockshop(SOCKSHOP)


def test_every_case_is_ranked(report: SockShopReport) -> None:
    assert len(report.results) == len(cases(SOCKSHOP / "sock-shop-data")) >= 30
    assert {r.case.fault for r in report.results} == {"cpu", "mem"}


def test_avg_at_5_per_fault_type(report: SockShopReport) -> None:
    # 1.00 and 1.00 here (BARO, published: 0.99 and 0.99).
    assert report.avg5("cpu") >= 0.97
    assert report.avg5("mem") >= 0.97
    assert report.avg5() >= 0.97


def test_the_evidence_names_the_resource(report: SockShopReport) -> None:
    firsts = [r for r in report.results if r.rank == 1]
    for r in firsts:
        families = {e.signal for e in r.top[0].evidence}
        if r.case.fault == "cpu":
            assert str(r.top[0].fault_class) == "cpu", r.case.name
        else:
            # The memory hog burns CPU too (more, in baseline spreads): the class may say
            # cpu, but the memory metric must be there.
            assert "metric:memory" in families, r.case.name


def test_the_report_sets_the_run_beside_the_published_rows(report: SockShopReport) -> None:
    table = render(report, PUBLISHED)
    assert "aiops rca (this run)" in table
    if PUBLISHED.is_file():
        assert "BARO [t_delta = 0] (published)" in table

"""What the dataset evaluations share within one test run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def raw_score_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of detectors' raw scores for the run: NAB's CAD and windowed-Gaussian
    scores are the same series whether the NAB protocol or the cloud_kpi transfer asks for
    them (keyed by method, parameters and files), so they are computed once."""
    return tmp_path_factory.mktemp("raw-scores")

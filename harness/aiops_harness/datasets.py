"""Where the evaluations and benchmarks read the public corpora (Nezha, RCD Sock Shop,
Loghub-2.0, NAB, PetShop, cloud KPIs, the published figures): passed in (each command's
``--datasets`` or argument), else ``$AIOPS_DATASETS``, else ``shared/datasets`` beside the
checkout. They are read where they lie, never copied into the repository."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATASETS", "datasets"]

# harness/aiops_harness/datasets.py -> the checkout's parent directory.
_BESIDE_CHECKOUT = Path(__file__).resolve().parents[3] / "shared" / "datasets"


def datasets() -> Path:
    """The corpora's root when none is passed in."""
    return Path(os.environ.get("AIOPS_DATASETS") or _BESIDE_CHECKOUT)


DATASETS = datasets()

"""Generate the incident fixtures (``python -m aiops_harness.agent_evals.generate [--out DIR]``).

Each case is a few minutes of what the real stack writes: the ingress SERVER span and the model
replica's INTERNAL span of every request, the replica's log record per inference (and the
ingress's warning per refused or failed request), the replicas' request-duration histograms,
and, where the eBPF collector runs, its per-process run-queue histograms and event counters.
Names, attributes and bodies are those of ``serve/ingress.py``, ``serve/replica.py`` and
``collectors/ebpf``. Simplifications that keep a case small (~100-130 KB gzipped): 6-7
minutes of history, low request rates (about 1-3 req/s), OTel histograms every 10 s (the live
replicas export every second) and timestamps in microseconds.

Everything is deterministic: one ``random.Random`` per case seeded by its name, fixed times,
gzip with mtime 0 and JSON with sorted keys, so a rerun writes byte-identical files.

The models and units (``model``), the serving topology and id/time helpers (``topology``), one
case's telemetry (``world``), case files (``casefile``), faults on the request path and the
pieces scenarios share (``faults``), the scenario families (``scenarios``) and the cases with
the command that writes them (``catalog``).
"""

from __future__ import annotations

from aiops_harness.agent_evals.generate.casefile import CaseSpec, write_case
from aiops_harness.agent_evals.generate.catalog import CASE_BUILDERS, DEFAULT_OUT, build_cases, main

__all__ = ["CASE_BUILDERS", "DEFAULT_OUT", "CaseSpec", "build_cases", "main", "write_case"]

"""Incident fixtures: a folder each, with the telemetry to load, the question and the facts a
correct answer states.

``case.yaml``::

    description: a v2 canary answers 6x slower than v1
    question: What happened to smollm2-135m-instruct in the last 15 minutes?
    now: 2026-11-01T10:20:00Z        # when the question is asked
    objectives:                       # SLOs the analyzer checks (as in a model spec's qos.slo)
      smollm2-135m-instruct: {p95_ms: 300, error_rate: 0.01}
    expect:
      component: smollm2-135m-instruct  # null: no incident should be reported
      version: v2
      fault_class: latency              # latency, errors, cpu, memory, network, crash
      onset: 2026-11-01T10:12:00Z       # +-60 s
    tags: [canary, latency]

Telemetry: ``spans.jsonl.gz``, ``logs.jsonl.gz``, ``metric_points.jsonl.gz`` (each optional),
one row per line in the store's own columns (``aiops.schema``), times as integer nanoseconds
since the epoch and JSON columns as JSON text.
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiops.analytics.findings import FaultClass
from aiops.analytics.slo import Objective
from aiops.errors import ConfigError
from aiops.schema import Kind, table
from aiops.store import Store

__all__ = ["CASES_DIR", "TELEMETRY_TABLES", "Case", "Expected", "load_case", "load_cases",
           "load_telemetry"]

CASES_DIR = Path(__file__).with_name("cases")
TELEMETRY_TABLES = ("spans", "logs", "metric_points")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SloSpec(_Strict):
    p95_ms: float | None = None
    error_rate: float | None = None


class Expected(_Strict):
    component: str | None
    version: str | None = None
    fault_class: FaultClass | None = None
    onset: datetime | None = None
    replica: str | None = None


class Case(_Strict):
    name: str = ""
    folder: Path = Path()
    description: str
    question: str = Field(min_length=1)
    now: datetime
    objectives: dict[str, SloSpec] = Field(default_factory=dict)
    expect: Expected
    tags: list[str] = Field(default_factory=list)

    @property
    def now_ns(self) -> int:
        return _ns(self.now)

    @property
    def onset_ns(self) -> int | None:
        return _ns(self.expect.onset) if self.expect.onset else None

    def analyzer_objectives(self) -> tuple[Objective, ...]:
        out = []
        for model, slo in self.objectives.items():
            out.append(Objective(model, slo.p95_ms, 0.05, slo.error_rate))
        return tuple(out)


def _ns(t: datetime) -> int:
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def load_case(folder: Path) -> Case:
    path = folder / "case.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
        return Case.model_validate({**raw, "name": folder.name, "folder": folder})
    except (OSError, yaml.YAMLError, ValidationError, TypeError) as exc:
        raise ConfigError(f"eval case {folder}: {exc}") from exc


def load_cases(root: Path = CASES_DIR, only: str | None = None) -> list[Case]:
    """Every case under ``root`` (``only``: names containing it), by name."""
    folders = sorted(p for p in root.iterdir() if (p / "case.yaml").is_file())
    return [load_case(f) for f in folders if only is None or only in f.name]


def load_telemetry(case: Case, store: Store) -> dict[str, int]:
    """Append the case's telemetry to ``store``; returns rows per table."""
    counts = {}
    for name in TELEMETRY_TABLES:
        path = case.folder / f"{name}.jsonl.gz"
        if not path.is_file():
            continue
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        schema = table(name).arrow_schema
        json_columns = [c.name for c in table(name).columns if c.kind is Kind.JSON]
        for r in rows:
            for col in json_columns:
                if isinstance(r.get(col), (dict, list)):
                    r[col] = json.dumps(r[col])
        store.append(name, pa.Table.from_pylist(rows, schema=schema))
        counts[name] = len(rows)
    return counts

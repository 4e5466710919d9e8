"""Case files: ``case.yaml`` and one gzipped JSON-lines file per telemetry table."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiops_harness.agent_evals.generate.model import Model
from aiops_harness.agent_evals.generate.topology import iso
from aiops_harness.agent_evals.generate.world import World


@dataclass
class CaseSpec:
    name: str
    world: World
    description: str
    question: str
    models: Sequence[Model]
    component: str | None
    version: str | None = None
    fault_class: str | None = None
    onset_ns: int | None = None
    replica: str | None = None
    tags: list[str] = field(default_factory=list)

    def yaml_text(self) -> str:
        expect: dict[str, Any] = {"component": self.component}
        if self.component is not None:
            expect |= {"version": self.version, "fault_class": self.fault_class,
                       "onset": iso(self.onset_ns) if self.onset_ns else None}
            if self.replica:
                expect["replica"] = self.replica
        doc = {"description": self.description, "question": self.question,
               "now": iso(self.world.now_ns),
               "objectives": {m.name: {"p95_ms": m.p95_ms, "error_rate": m.error_rate}
                              for m in self.models},
               "expect": expect, "tags": self.tags}
        return str(yaml.safe_dump(doc, sort_keys=False, width=96, allow_unicode=True))


def _jsonl_gz(rows: list[dict[str, Any]], time_key: str) -> bytes:
    rows = sorted(rows, key=lambda r: (r[time_key], r.get("name") or "", r.get("span_id") or ""))
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
    out = gzip.compress(text.encode(), compresslevel=9, mtime=0)
    return out


def write_case(spec: CaseSpec, root: Path) -> Path:
    w = spec.world
    w.emit()
    w.replica_metrics()
    folder = root / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "case.yaml").write_text(spec.yaml_text())
    for table, rows, key in (("spans", w.spans, "start_time"), ("logs", w.logs, "time"),
                             ("metric_points", w.points, "time")):
        path = folder / f"{table}.jsonl.gz"
        if rows:
            path.write_bytes(_jsonl_gz(rows, key))
        elif path.exists():
            path.unlink()
    return folder

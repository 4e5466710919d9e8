"""Every query a generated dashboard will run: panel targets, template variables and
annotations, each with where it sits, so tests (and readers) can execute them all."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dashboards.datasources import INFINITY, PROMETHEUS

__all__ = ["DashboardQuery", "queries", "variables"]


@dataclass(frozen=True)
class DashboardQuery:
    dashboard: str
    where: str  # "panel 3 'Requests per second' A", "variable model", "annotation ..."
    datasource: str  # the datasource uid
    target: dict[str, Any]

    @property
    def is_prometheus(self) -> bool:
        return self.datasource == PROMETHEUS.uid

    @property
    def is_infinity(self) -> bool:
        return self.datasource == INFINITY.uid

    @property
    def expr(self) -> str:
        """PromQL of a Prometheus target (a variable's ``label_values(...)`` included)."""
        return str(self.target.get("expr") or self.target.get("query") or "")


def variables(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc.get("templating", {}).get("list", []))


def queries(doc: dict[str, Any]) -> Iterator[DashboardQuery]:
    uid = str(doc["uid"])
    for panel in _panels(doc.get("panels", [])):
        source = (panel.get("datasource") or {}).get("uid", "")
        for t in panel.get("targets", []):
            ds = (t.get("datasource") or {}).get("uid", source)
            yield DashboardQuery(uid, f"panel {panel.get('id')} {panel.get('title')!r} "
                                 f"{t.get('refId')}", ds, t)
    for v in variables(doc):
        if v.get("type") != "query":
            continue
        ds = (v.get("datasource") or {}).get("uid", "")
        q = v.get("query")
        target = q.get("infinityQuery", q) if isinstance(q, dict) else {"query": q}
        yield DashboardQuery(uid, f"variable {v['name']}", ds, target)
    for a in doc.get("annotations", {}).get("list", []):
        if a.get("builtIn"):
            continue
        yield DashboardQuery(uid, f"annotation {a.get('name')!r}",
                             (a.get("datasource") or {}).get("uid", ""), a.get("target", {}))


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))  # collapsed rows hold their panels

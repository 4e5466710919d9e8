"""Panel helpers shared by the dashboards: one call per panel, Prometheus or Infinity.

Panels are laid out by the SDK (each ``span``/``height`` flows left to right, then down);
ids are given in ``Board.build`` so that the generated JSON is stable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

from dashboards.datasources import INFINITY, PROMETHEUS
from dashboards.infinity import Infinity, InfinityAnnotation

__all__ = ["Board", "infinity_variable", "prom", "prom_variable", "stat_panel",
           "table_panel", "timeseries_panel"]

Query = cogbuilder.Builder[cogvariants.Dataquery]

# Grafana's rate window: at least four scrape intervals (the datasource's timeInterval).
RATE = "$__rate_interval"


def prom(expr: str, legend: str = "", ref: str = "A", instant: bool = False
         ) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(" ".join(expr.split())).ref_id(ref)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def _source(queries: list[Query]) -> DataSourceRef:
    return INFINITY if any(isinstance(q, Infinity) for q in queries) else PROMETHEUS


def _refs(queries: list[Query]) -> list[Query]:
    # Each query of a panel needs its own refId (A, B, ...).
    out = []
    for i, q in enumerate(queries):
        ref = chr(ord("A") + i)
        out.append(q.ref_id(ref) if isinstance(q, Infinity | prometheus.Dataquery) else q)
    return out


def timeseries_panel(title: str, description: str, unit: str, *queries: Query,
                     width: int = 12, height: int = 8, stacked: bool = False
                     ) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(description).unit(unit)
         .datasource(_source(list(queries))).targets(_refs(list(queries)))
         .span(width).height(height).line_width(1).fill_opacity(10)
         .legend(common_builders.VizLegendOptions().show_legend(True)
                 .display_mode(common.LegendDisplayMode.TABLE)
                 .placement(common.LegendPlacement.BOTTOM).calcs(["mean", "max", "lastNotNull"])))
    if stacked:
        p = p.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    return p


def stat_panel(title: str, description: str, unit: str, *queries: Query, width: int = 6,
               height: int = 4) -> stat.Panel:
    return (stat.Panel().title(title).description(description).unit(unit)
            .datasource(_source(list(queries))).targets(_refs(list(queries)))
            .span(width).height(height)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"])))


def table_panel(title: str, description: str, *queries: Query, width: int = 24,
                height: int = 8) -> table.Panel:
    return (table.Panel().title(title).description(description)
            .datasource(_source(list(queries))).targets(_refs(list(queries)))
            .span(width).height(height).filterable(True))


def prom_variable(name: str, label: str, query: str, include_all: bool = True
                  ) -> dashboard.QueryVariable:
    v = (dashboard.QueryVariable(name).label(label).datasource(PROMETHEUS).query(query)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC))
    if include_all:
        v = v.include_all(True).multi(True).all_value(".*")
    return v


def infinity_variable(name: str, label: str, query: Infinity) -> dashboard.QueryVariable:
    # Infinity's variable editor stores its query under "infinityQuery".
    body: dict[str, object] = {"queryType": "infinity", "infinityQuery": query.fields()}
    return (dashboard.QueryVariable(name).label(label).datasource(INFINITY).query(body)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))


@dataclass
class Board:
    """A dashboard under construction: rows of panels, variables and annotations."""

    uid: str
    title: str
    description: str
    tags: list[str] = field(default_factory=list)
    items: list[cogbuilder.Builder[Any]] = field(default_factory=list)
    variables: list[dashboard.QueryVariable] = field(default_factory=list)
    annotations: list[dashboard.AnnotationQuery] = field(default_factory=list)
    time_from: str = "now-1h"

    def row(self, title: str) -> Board:
        self.items.append(dashboard.Row(title))
        return self

    def add(self, *panels: cogbuilder.Builder[Any]) -> Board:
        self.items.extend(panels)
        return self

    def annotate(self, name: str, color: str, query: Infinity) -> Board:
        self.annotations.append(
            dashboard.AnnotationQuery().name(name).datasource(INFINITY).enable(True)
            .icon_color(color).target(InfinityAnnotation(query)))
        return self

    def build(self) -> dict[str, Any]:
        d = (dashboard.Dashboard(self.title).uid(self.uid).description(self.description)
             .tags(["aiops", *self.tags]).refresh("30s").time(self.time_from, "now")
             .timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).readonly())
        for v in self.variables:
            d = d.with_variable(v)
        for a in self.annotations:
            d = d.annotation(a)
        for i, item in enumerate(self.items, start=1):
            item_with_id: Any = item
            item_with_id.id(i)
            d = d.with_row(item) if isinstance(item, dashboard.Row) else d.with_panel(item)
        # Plain JSON types all the way down (the SDK's to_json is shallow).
        built: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
        return built

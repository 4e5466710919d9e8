"""What a telemetry answer carries: the figures, the SQL that produced them, and what could
not be answered.

Every figure comes from a query the answer cites (parameters written in, so a reader can paste
it into ``aiops sql``); a question the store has no data for says so instead of guessing.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from agents.intent import Intent
from agents.tools import Toolbox
from aiops.errors import AIOpsError

__all__ = ["NS", "Ask", "CitedQuery", "Report", "inline", "utc"]

NS = 1_000_000_000


class CitedQuery(BaseModel):
    sql: str  # as run, with its parameters written in
    rows: int
    error: str | None = None


class Report(BaseModel):
    kind: str
    headline: str
    lines: list[str] = Field(default_factory=list)
    rows: list[dict[str, Any]] = Field(default_factory=list)  # the table behind the lines
    queries: list[CitedQuery] = Field(default_factory=list)
    gaps: list[str] = Field(default_factory=list)  # asked, not answerable here, and why
    totals: dict[str, int] = Field(default_factory=dict)  # counts behind a shortened list


def inline(sql: str, params: list[Any]) -> str:
    """The SQL with its ``?`` parameters written in as literals (for reading, not running),
    one clause a line."""
    out, values = [], iter(params)
    for piece in re.split(r"(\?)", sql):
        if piece != "?":
            out.append(piece)
            continue
        v = next(values)
        if v is None:
            out.append("NULL")
        elif isinstance(v, datetime):
            out.append(f"TIMESTAMP '{v:%Y-%m-%d %H:%M:%S}'")
        elif isinstance(v, int | float):
            out.append(str(v))
        else:
            out.append("'" + str(v).replace("'", "''") + "'")
    lines = (line.strip() for line in "".join(out).splitlines())
    return "\n".join(line for line in lines if line)


def utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS, UTC).replace(tzinfo=None)


class Ask:
    """One question being answered: its intent, the window, and the report it fills."""

    def __init__(self, box: Toolbox, intent: Intent, question: str, headline: str) -> None:
        self.box = box
        self.intent = intent
        self.question = question
        self.now_ns = box.now()
        self.start_ns = self.now_ns - int(intent.minutes * 60 * NS)
        # The window as naive UTC timestamps: DuckDB compares them with TIMESTAMP_NS columns,
        # and the cited SQL reads as times, not nanoseconds.
        self.since, self.until = utc(self.start_ns), utc(self.now_ns)
        self.report = Report(kind=str(intent.kind), headline=headline)

    @property
    def window(self) -> str:
        m = self.intent.minutes
        if m == 60:
            return "the last hour"
        if m > 60 and m % 60 == 0:
            return f"the last {m / 60:g} hours"
        return f"the last {m:g} minute{'s' if m != 1 else ''}"

    def rows(self, sql: str, params: list[Any], limit: int = 200) -> list[dict[str, Any]]:
        """Run a query the answer cites; a failure is a gap, not an exception."""
        cited = CitedQuery(sql=inline(sql, params), rows=0)
        self.report.queries.append(cited)
        try:
            result = self.box.query(sql, params, limit)
        except AIOpsError as exc:
            cited.error = str(exc)
            self.report.gaps.append(f"a query failed: {exc}")
            return []
        cited.rows = len(result.rows)
        return [dict(zip(result.columns, r, strict=True)) for r in result.rows]

    def say(self, line: str) -> None:
        self.report.lines.append(line)

    def gap(self, why: str) -> None:
        self.report.gaps.append(why)

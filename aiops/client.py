"""A small client for the aiops server's HTTP API, used by the CLI, the demo and the tests."""

from __future__ import annotations

from typing import Any

import httpx

from aiops.errors import AIOpsError, StackError

__all__ = ["QueryFailed", "ServerClient", "error_message"]


def error_message(resp: httpx.Response) -> str:
    """The ``{"error": ...}`` message aiops' HTTP APIs answer with, else the raw body."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    return str(body.get("error", resp.text)) if isinstance(body, dict) else resp.text


class QueryFailed(AIOpsError):
    """The server refused or failed a query; the message is the server's."""


class ServerClient:
    def __init__(self, base_url: str, transport: httpx.BaseTransport | None = None,
                 timeout_s: float = 30.0) -> None:
        self._http = httpx.Client(base_url=base_url, transport=transport, timeout=timeout_s)

    def sql(self, query: str, params: list[Any] | None = None,
            limit: int | None = None) -> dict[str, Any]:
        """Run a read-only query; returns ``{"columns", "types", "rows", "truncated"}``."""
        body: dict[str, Any] = {"sql": query, "params": params or []}
        if limit is not None:
            body["limit"] = limit
        try:
            resp = self._http.post("/api/v1/sql", json=body)
        except httpx.HTTPError as exc:
            raise StackError(f"cannot reach the aiops server at {self._http.base_url}: {exc}") \
                from exc
        if resp.status_code != 200:
            raise QueryFailed(f"HTTP {resp.status_code}: {error_message(resp)}")
        result: dict[str, Any] = resp.json()
        return result

    def rows(self, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a query as dicts keyed by column name."""
        result = self.sql(query, params)
        return [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

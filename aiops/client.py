"""A small client for the aiops server's HTTP API, used by the CLI, the demo and the tests."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from aiops.config import Settings
from aiops.errors import AIOpsError, StackError
from aiops.tls import client_verify

__all__ = ["NotAuthorized", "QueryFailed", "ServerClient", "client_token", "error_message"]


def error_message(resp: httpx.Response) -> str:
    """The ``{"error": ...}`` message aiops' HTTP APIs answer with, else the raw body."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    if not isinstance(body, dict):
        return resp.text
    return str(body.get("error") or body.get("detail") or resp.text)


def client_token(settings: Settings) -> str | None:
    """The token aiops' own clients send: ``AIOPS_TOKEN`` when set (whatever else this machine
    holds: it is never swapped for the admin token), else the admin token (``AIOPS_ADMIN_TOKEN``,
    else its file in the data dir), else none."""
    return _token_and_source(settings)[0]


def _token_and_source(settings: Settings) -> tuple[str | None, str]:
    """``client_token`` and where it came from, for error messages (never the token)."""
    if settings.token:
        return settings.token, "AIOPS_TOKEN"
    if settings.admin_token:
        return settings.admin_token, "AIOPS_ADMIN_TOKEN"
    from aiops.lifecycle import ADMIN_TOKEN_FILE, admin_token  # it imports this module

    try:
        return admin_token(settings), f"the admin token in {settings.data_dir / ADMIN_TOKEN_FILE}"
    except StackError:
        return None, ("no token (set AIOPS_TOKEN, or AIOPS_ADMIN_TOKEN, or run where `aiops "
                      "up` wrote the admin token)")


def _bearer(token: str | None) -> dict[str, str]:
    """A request's own ``Authorization`` header, overriding the client's; none: the client's."""
    return {"authorization": f"Bearer {token}"} if token else {}


class QueryFailed(AIOpsError):
    """The server refused or failed a query; the message is the server's."""


class NotAuthorized(QueryFailed):
    """The server refused the token this client sent (401) or its role (403)."""


class ServerClient:
    def __init__(self, base_url: str, transport: httpx.BaseTransport | None = None,
                 timeout_s: float = 30.0, verify: ssl.SSLContext | bool = True,
                 token: str | None = None, token_source: str | None = None) -> None:
        self._token_source = token_source or ("the token given" if token else "no token")
        self._http = httpx.Client(
            base_url=base_url, transport=transport, timeout=timeout_s, verify=verify,
            headers={"authorization": f"Bearer {token}"} if token else None)

    @classmethod
    def of(cls, settings: Settings, timeout_s: float = 30.0) -> ServerClient:
        """A client of the server these settings describe (its URL, TLS trust and token:
        ``AIOPS_TOKEN``, else the admin token where this machine has it, else none)."""
        token, source = _token_and_source(settings)
        return cls(settings.server_url, timeout_s=timeout_s, verify=client_verify(settings),
                   token=token, token_source=source)

    def sql(self, query: str, params: list[Any] | None = None,
            limit: int | None = None) -> dict[str, Any]:
        """Run a read-only query; returns ``{"columns", "types", "rows", "truncated"}``."""
        body: dict[str, Any] = {"sql": query, "params": params or []}
        if limit is not None:
            body["limit"] = limit
        return self._request("POST", "/api/v1/sql", json=body)

    def _request(self, method: str, path: str, ok: tuple[int, ...] = (200,),
                 **kwargs: Any) -> dict[str, Any]:
        """One call; an unreachable server is a StackError, another answer than ``ok``
        QueryFailed."""
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise StackError(f"cannot reach the aiops server at {self._http.base_url}: {exc}") \
                from exc
        if resp.status_code in (401, 403) and resp.status_code not in ok:
            raise NotAuthorized(f"HTTP {resp.status_code}: {error_message(resp)} "
                                f"(sent: {self._token_source})")
        if resp.status_code not in ok:
            raise QueryFailed(f"HTTP {resp.status_code}: {error_message(resp)}")
        result: dict[str, Any] = resp.json()
        return result

    def rows(self, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a query as dicts keyed by column name."""
        result = self.sql(query, params)
        return [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]

    def _get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._request("GET", path, params=params)

    def incidents(self, status: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get(
            "/api/v1/incidents", {"status": status} if status else None)["incidents"]
        return found

    def incident(self, incident_id: str) -> dict[str, Any]:
        return self._get(f"/api/v1/incidents/{incident_id}")

    def actions(self, status: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get(
            "/api/v1/actions", {"status": status} if status else None)["actions"]
        return found

    def decide(self, action_id: str, approve: bool, token: str | None = None,
               user: str = "cli") -> dict[str, Any]:
        """Approve or deny a pending action with this client's token, or ``token`` (which
        overrides it); the server wants the admin role, and answers another's with 403
        (``NotAuthorized``)."""
        verdict = "approve" if approve else "deny"
        return self._request("POST", f"/api/v1/actions/{action_id}/{verdict}",
                             headers={**_bearer(token), "x-aiops-user": user})

    def rollout(self, model: str, version: str, token: str | None = None,
                steps: list[int] | None = None, step_s: float | None = None
                ) -> dict[str, Any]:
        """Start a progressive canary with this client's token, or ``token`` (the server
        wants the admin role); its state, 202."""
        body: dict[str, Any] = {"model": model, "version": version}
        if steps:
            body["steps"] = steps
        if step_s:
            body["step_s"] = step_s
        return self._request("POST", "/api/v1/rollouts", json=body, headers=_bearer(token),
                             ok=(202,))

    def rollouts(self, rollout_id: str | None = None) -> dict[str, Any]:
        return self._get(f"/api/v1/rollouts/{rollout_id}" if rollout_id else "/api/v1/rollouts")

    def ask(self, question: str, user: str = "cli", token: str | None = None,
            timeout_s: float = 180.0) -> dict[str, Any]:
        """A chat-ops question with this client's token (or ``token``, which overrides it);
        an operator's or admin's may propose actions."""
        return self._request("POST", "/v1/chatops", json={"question": question, "user": user},
                             headers=_bearer(token), timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

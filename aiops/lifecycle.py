"""Python client of the Serve control plane (model lifecycle): what the CLI and the automated
actions call. Every refusal raises ``LifecycleError`` with the server's message; a status
that does not fit ``aiops.control_status`` raises ``MalformedStatus``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from aiops.auth import ADMIN_TOKEN_FILE
from aiops.client import error_message
from aiops.config import Settings
from aiops.control_status import ControlStatus, MalformedStatus
from aiops.errors import AIOpsError, StackError

__all__ = ["ADMIN_TOKEN_FILE", "LifecycleClient", "LifecycleError", "admin_token"]



class LifecycleError(AIOpsError):
    """The control plane refused an operation; nothing changed."""


class LifecycleClient:
    def __init__(self, base_url: str, token: str, transport: httpx.BaseTransport | None = None,
                 timeout_s: float = 600.0) -> None:
        self._http = httpx.Client(base_url=base_url, transport=transport, timeout=timeout_s,
                                  headers={"authorization": f"Bearer {token}"})

    @classmethod
    def from_settings(cls, settings: Settings) -> LifecycleClient:
        return cls(f"http://{settings.serve_host}:{settings.control_port}",
                   admin_token(settings))

    def _request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise StackError(f"cannot reach the control plane at {self._http.base_url}: "
                             f"{exc}") from exc
        if resp.status_code >= 400:
            raise LifecycleError(f"HTTP {resp.status_code}: {error_message(resp)}")
        return resp

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = self._request(method, path, body).json()
        return out

    def status(self) -> ControlStatus:
        resp = self._request("GET", "/v1/models")
        source = f"the control plane at {self._http.base_url}"
        try:
            data = resp.json()
        except ValueError as exc:
            raise MalformedStatus(f"{source} answered non-JSON") from exc
        return ControlStatus.parse(data, source)

    def apply(self, specs: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", "/v1/models/apply", {"models": specs})

    def canary(self, model: str, version: str, percent: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/canary",
                          {"version": version, "percent": percent})

    def set_traffic(self, model: str, weights: dict[str, int]) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/traffic", {"weights": weights})

    def promote(self, model: str, version: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/promote", {"version": version})

    def rollback(self, model: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/rollback")

    def scale(self, model: str, version: str, min_replicas: int, max_replicas: int
              ) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/versions/{version}/scale",
                          {"min_replicas": min_replicas, "max_replicas": max_replicas})

    def restart_replica(self, model: str, version: str, replica: str | None = None
                        ) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{model}/versions/{version}/restart",
                          {"replica": replica})

    def shed(self, model: str, classes: list[str]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/models/{model}/shed", {"classes": classes})

    def set_faults(self, model: str, version: str, faults: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/models/{model}/versions/{version}/faults", faults)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LifecycleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def admin_token(settings: Settings) -> str:
    """The admin token: AIOPS_ADMIN_TOKEN, else the one `aiops up` wrote to the data dir."""
    if settings.admin_token:
        return settings.admin_token
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise StackError(f"no admin token: set AIOPS_ADMIN_TOKEN or start the stack "
                         f"(`aiops up`), which writes {path}") from exc
    if not token:
        raise StackError(f"the admin token file {path} is empty")
    return token

"""The control plane's HTTP API (loopback, token-protected), served by the Serve driver.

``Authorization: Bearer <token>`` on every route; the token is ``AIOPS_ADMIN_TOKEN`` or, when
empty, one generated at start-up and written to ``<data_dir>/admin.token`` (mode 0600), where
the CLI finds it. Refused operations answer 400/404/409 with ``{"error": ...}``.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from serve.control import ControlError, DeployFailed, GateRefused, NotFound, ServeControl
from serve.specs import ModelSpec

__all__ = ["create_control_app"]


class ApplyBody(BaseModel):
    models: list[dict[str, Any]] = Field(min_length=1)


class CanaryBody(BaseModel):
    version: str
    percent: int = Field(ge=0, le=100)


class TrafficBody(BaseModel):
    weights: dict[str, int]


class VersionBody(BaseModel):
    version: str


class RestartBody(BaseModel):
    replica: str | None = Field(None, max_length=64, description="Default: the first.")


class ShedBody(BaseModel):
    classes: list[str] = Field(max_length=4, description="Priority classes; [] lifts it.")


class ScaleBody(BaseModel):
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)


def create_control_app(control: ServeControl, token: str) -> FastAPI:
    app = FastAPI(title="aiops serve control plane")

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"error": "missing or invalid admin token"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=400)

    @app.exception_handler(ControlError)
    async def refused(_: Request, exc: ControlError) -> JSONResponse:
        code = (404 if isinstance(exc, NotFound) else 409 if isinstance(exc, DeployFailed)
                else 422 if isinstance(exc, GateRefused) else 400)
        return JSONResponse({"error": str(exc)}, status_code=code)

    @app.get("/v1/models")
    async def status() -> dict[str, Any]:
        return control.status().wire()

    @app.post("/v1/models/apply")
    async def apply(body: ApplyBody) -> dict[str, Any]:
        try:
            specs = [ModelSpec.model_validate(m) for m in body.models]
        except ValidationError as exc:
            raise ControlError(f"invalid model spec: {exc.errors()[0]['loc']}: "
                               f"{exc.errors()[0]['msg']}") from exc
        return await run_in_threadpool(control.apply, specs)

    @app.post("/v1/models/{model}/canary")
    async def canary(model: str, body: CanaryBody) -> dict[str, Any]:
        await run_in_threadpool(control.canary, model, body.version, body.percent)
        return _model_status(control, model)

    @app.post("/v1/models/{model}/traffic")
    async def traffic(model: str, body: TrafficBody) -> dict[str, Any]:
        await run_in_threadpool(control.set_traffic, model, body.weights)
        return _model_status(control, model)

    @app.post("/v1/models/{model}/promote")
    async def promote(model: str, body: VersionBody) -> dict[str, Any]:
        await run_in_threadpool(control.promote, model, body.version)
        return _model_status(control, model)

    @app.post("/v1/models/{model}/rollback")
    async def rollback(model: str) -> dict[str, Any]:
        await run_in_threadpool(control.rollback, model)
        return _model_status(control, model)

    @app.post("/v1/models/{model}/versions/{version}/scale")
    async def scale(model: str, version: str, body: ScaleBody) -> dict[str, Any]:
        await run_in_threadpool(control.scale, model, version, body.min_replicas,
                                body.max_replicas)
        return _model_status(control, model)

    @app.post("/v1/models/{model}/versions/{version}/restart")
    async def restart(model: str, version: str, body: RestartBody) -> dict[str, Any]:
        replica = await run_in_threadpool(control.restart_replica, model, version,
                                          body.replica)
        return {"model": model, "version": version, "restarted": replica}

    @app.put("/v1/models/{model}/shed")
    async def shed(model: str, body: ShedBody) -> dict[str, Any]:
        await run_in_threadpool(control.shed, model, body.classes)
        return _model_status(control, model)

    @app.put("/v1/models/{model}/versions/{version}/faults")
    async def faults(model: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        await run_in_threadpool(control.set_faults, model, version, body)
        return _model_status(control, model)

    return app


def _model_status(control: ServeControl, model: str) -> dict[str, Any]:
    """The model's status as ``GET /v1/models`` reports it (only the fields set)."""
    return control.status().models[model].wire()

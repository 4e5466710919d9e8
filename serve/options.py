"""What the Serve application is built from: the model specs plus process-wide options."""

from __future__ import annotations

from dataclasses import dataclass

from aiops.config import Settings
from serve.specs import DEFAULT_SPECS_FILE, ModelSpec, load_specs
from serve.telemetry import TelemetryConfig

__all__ = ["ServeOptions"]


@dataclass(frozen=True)
class ServeOptions:
    specs: tuple[ModelSpec, ...]
    telemetry: TelemetryConfig
    app_name: str = "aiops"
    api_keys: tuple[str, ...] = ()
    max_request_bytes: int = 20 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings, ingest_token: str | None = None) -> ServeOptions:
        """``ingest_token``: the serving stack's credential its exporters send."""
        return cls(
            specs=tuple(load_specs(settings.models_file or DEFAULT_SPECS_FILE)),
            telemetry=TelemetryConfig(
                settings.server_url, settings.otlp_export_interval_s,
                certificate_file=str(settings.server_tls_ca) if settings.server_tls_ca else None,
                token=ingest_token),
            api_keys=tuple(k.strip() for k in settings.api_keys.split(",") if k.strip()),
            max_request_bytes=settings.max_request_bytes,
        )

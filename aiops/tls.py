"""TLS of the aiops server: what uvicorn serves with and what its clients verify against.

Every client of the server (CLI, stack health checks, benchmarks, the eBPF collector, Serve
replicas' OTLP exporters) takes its trust from the same settings as the server, so one
configuration file makes the whole stack speak HTTPS.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiops.config import Settings
from aiops.errors import ConfigError

__all__ = ["client_verify", "server_ssl_options"]


def server_ssl_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's keyword arguments for the server's certificate; empty without TLS."""
    if settings.server_tls_cert is None:
        if settings.server_tls_ca is not None:
            # Clients would speak https to a server that speaks http.
            raise ConfigError("AIOPS_SERVER_TLS_CA alone configures a client of an https "
                              "server; to serve HTTPS set AIOPS_SERVER_TLS_CERT and "
                              "AIOPS_SERVER_TLS_KEY")
        return {}
    return {"ssl_certfile": str(settings.server_tls_cert),
            "ssl_keyfile": str(settings.server_tls_key)}


def client_verify(settings: Settings) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for requests to the server: the configured CA, else httpx's
    default bundle (certifi)."""
    if settings.server_tls_ca is None:
        return True
    return ssl.create_default_context(cafile=str(settings.server_tls_ca))

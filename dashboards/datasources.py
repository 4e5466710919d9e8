"""The two datasources every dashboard uses, and their Grafana provisioning.

Prometheus (uid ``aiops-prometheus``) holds live metrics: the aiops server's own ``/metrics``,
the OTLP serving metrics it re-exposes on ``/metrics/otlp``, and Ray's metrics endpoint.
Infinity (uid ``aiops-api``) reads the aiops server's JSON API (incidents, actions, read-only
SQL over spans, logs and metric points in DuckDB). Fixed uids let dashboards reference them
without lookups, in provisioning and in ``aiops dashboards push`` alike.

The aiops server wants a bearer token beyond loopback: provisioning gives Infinity the viewer
token that ``aiops credentials init`` writes for Grafana, read by Grafana from a file
(``$__file{...}``, ``SERVER_TOKEN_FILE`` where docker-compose.yml mounts it), so the committed
file holds no secret.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models.dashboard import DataSourceRef

__all__ = [
    "DASHBOARDS_PATH",
    "DEFAULT_PROMETHEUS_URL",
    "DEFAULT_SERVER_URL",
    "INFINITY",
    "INFINITY_PLUGIN",
    "PROMETHEUS",
    "SERVER_TOKEN_FILE",
    "datasources",
    "provisioning_dashboards",
    "provisioning_datasources",
]

INFINITY_PLUGIN = "yesoreyeram-infinity-datasource"
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="aiops-prometheus")
INFINITY = DataSourceRef(type_val=INFINITY_PLUGIN, uid="aiops-api")

# Service names of docker-compose.yml; other deployments pass their own URLs.
DEFAULT_PROMETHEUS_URL = "http://prometheus:9090"
DEFAULT_SERVER_URL = "http://aiops:4318"
# Where the Grafana container finds the generated dashboards (mounted by docker-compose.yml).
DASHBOARDS_PATH = "/var/lib/grafana/dashboards/aiops"
# Where the Grafana container finds its viewer token of the aiops server (docker-compose.yml
# mounts the credentials `aiops credentials init` shares with Grafana there).
SERVER_TOKEN_FILE = "/etc/grafana/aiops-credentials/grafana.token"


def datasources(prometheus_url: str, server_url: str,
                server_ca: str | None = None,
                server_token: str | None = None) -> list[dict[str, Any]]:
    """Datasource definitions (Grafana's API and provisioning share these fields);
    ``server_ca`` is the PEM CA an https aiops server's certificate is verified against,
    ``server_token`` the bearer token Infinity sends it (a viewer's; in provisioning a
    ``$__file{path}`` reference Grafana resolves)."""
    json_data: dict[str, Any] = {"allowedHosts": [server_url]}
    secure: dict[str, Any] = {}
    if server_ca is not None:
        json_data["tlsAuthWithCACert"] = True
        secure["tlsCACert"] = server_ca
    if server_token is not None:
        json_data["auth_method"] = "bearerToken"
        secure["bearerToken"] = server_token
    infinity_secure = {"secureJsonData": secure} if secure else {}
    return [
        {"name": "Prometheus", "type": "prometheus", "uid": PROMETHEUS.uid, "access": "proxy",
         "url": prometheus_url, "isDefault": True,
         "jsonData": {"timeInterval": "5s", "httpMethod": "POST"}},
        # Infinity sends relative URLs to this base URL, and only to hosts it allows.
        {"name": "aiops API", "type": INFINITY_PLUGIN, "uid": INFINITY.uid, "access": "proxy",
         "url": server_url, "isDefault": False,
         "jsonData": json_data, **infinity_secure},
    ]


def provisioning_datasources(prometheus_url: str, server_url: str,
                             server_ca: str | None = None,
                             server_token_file: str | None = SERVER_TOKEN_FILE
                             ) -> dict[str, Any]:
    """Provisioning of both datasources; Infinity reads its bearer token from
    ``server_token_file`` in the Grafana container (None: sends none)."""
    token = f"$__file{{{server_token_file}}}" if server_token_file is not None else None
    return {"apiVersion": 1, "datasources": [
        {**d, "editable": False}
        for d in datasources(prometheus_url, server_url, server_ca, token)]}


def provisioning_dashboards() -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [{
        "name": "aiops", "orgId": 1, "folder": "aiops", "type": "file",
        "disableDeletion": True, "allowUiUpdates": False, "updateIntervalSeconds": 30,
        "options": {"path": DASHBOARDS_PATH, "foldersFromFilesStructure": False},
    }]}

"""The two datasources every dashboard uses, and their Grafana provisioning.

Prometheus (uid ``aiops-prometheus``) holds live metrics: the aiops server's own ``/metrics``,
the OTLP serving metrics it re-exposes on ``/metrics/otlp``, and Ray's metrics endpoint.
Infinity (uid ``aiops-api``) reads the aiops server's JSON API (incidents, actions, read-only
SQL over spans, logs and metric points in DuckDB). Fixed uids let dashboards reference them
without lookups, in provisioning and in ``aiops dashboards push`` alike.
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


def datasources(prometheus_url: str, server_url: str,
                server_ca: str | None = None) -> list[dict[str, Any]]:
    """Datasource definitions (Grafana's API and provisioning share these fields);
    ``server_ca`` is the PEM CA an https aiops server's certificate is verified against."""
    infinity_tls: dict[str, Any] = {}
    if server_ca is not None:
        infinity_tls = {"jsonData": {"allowedHosts": [server_url], "tlsAuthWithCACert": True},
                        "secureJsonData": {"tlsCACert": server_ca}}
    return [
        {"name": "Prometheus", "type": "prometheus", "uid": PROMETHEUS.uid, "access": "proxy",
         "url": prometheus_url, "isDefault": True,
         "jsonData": {"timeInterval": "5s", "httpMethod": "POST"}},
        # Infinity sends relative URLs to this base URL, and only to hosts it allows.
        {"name": "aiops API", "type": INFINITY_PLUGIN, "uid": INFINITY.uid, "access": "proxy",
         "url": server_url, "isDefault": False,
         "jsonData": {"allowedHosts": [server_url]}, **infinity_tls},
    ]


def provisioning_datasources(prometheus_url: str, server_url: str,
                             server_ca: str | None = None) -> dict[str, Any]:
    return {"apiVersion": 1, "datasources": [
        {**d, "editable": False} for d in datasources(prometheus_url, server_url, server_ca)]}


def provisioning_dashboards() -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [{
        "name": "aiops", "orgId": 1, "folder": "aiops", "type": "file",
        "disableDeletion": True, "allowUiUpdates": False, "updateIntervalSeconds": 30,
        "options": {"path": DASHBOARDS_PATH, "foldersFromFilesStructure": False},
    }]}

"""Upload the dashboards (and their datasources) to a running Grafana with grafana-client.

Grafana's HTTP API is idempotent here: datasources are updated by uid or created, the folder
is created once, dashboards are saved with ``overwrite`` so a push replaces what an earlier
push left. grafana-client's errors are translated into ``AIOpsError`` at this boundary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException
from requests import RequestException

from aiops.errors import AIOpsError
from dashboards.datasources import datasources

__all__ = ["FOLDER_UID", "PushReport", "push"]

FOLDER_UID = "aiops"


@dataclass
class PushReport:
    datasources: list[str] = field(default_factory=list)
    dashboards: list[str] = field(default_factory=list)


def push(url: str, token: str | None, dashboards: dict[str, str],
         datasource_urls: tuple[str, str] | None = None,
         progress: Callable[[str], None] = lambda _: None,
         api: GrafanaApi | None = None, server_ca: str | None = None,
         server_token: str | None = None) -> PushReport:
    """Upload ``dashboards`` (file name -> JSON text) into the ``aiops`` folder; with
    ``datasource_urls`` (Prometheus URL, aiops server URL) create or update the datasources
    first (``server_ca``: the PEM CA of an https server). ``token`` is a service-account
    token (or None for credentials in ``url``)."""
    grafana = api or GrafanaApi.from_url(url, credential=token)
    report = PushReport()
    try:
        if datasource_urls is not None:
            for ds in datasources(*datasource_urls, server_ca, server_token):
                _upsert_datasource(grafana, ds)
                report.datasources.append(ds["uid"])
                progress(f"datasource {ds['name']} ({ds['uid']})")
        _ensure_folder(grafana)
        for name, text in sorted(dashboards.items()):
            doc: dict[str, Any] = json.loads(text)
            grafana.dashboard.update_dashboard({
                "dashboard": {**doc, "id": None}, "folderUid": FOLDER_UID,
                "overwrite": True, "message": "aiops dashboards push"})
            report.dashboards.append(doc["uid"])
            progress(f"dashboard {doc['title']} ({name})")
    except GrafanaException as exc:
        raise AIOpsError(f"Grafana at {url} refused the push: {exc.status_code} "
                         f"{exc.message}") from exc
    except RequestException as exc:
        raise AIOpsError(f"cannot reach Grafana at {url}: {exc}") from exc
    return report


def _upsert_datasource(grafana: GrafanaApi, ds: dict[str, Any]) -> None:
    try:
        grafana.datasource.get_datasource_by_uid(ds["uid"])
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        grafana.datasource.create_datasource(ds)
        return
    grafana.datasource.update_datasource_by_uid(ds["uid"], ds)


def _ensure_folder(grafana: GrafanaApi) -> None:
    try:
        grafana.folder.get_folder(FOLDER_UID)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        grafana.folder.create_folder("aiops", uid=FOLDER_UID)

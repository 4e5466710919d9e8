"""Every route declares who may call it, and tokens are checked strictly (P11 items 5, 7, 9).

The app runs in a loopback uvicorn but is configured as if it listened beyond loopback
(``server_host=0.0.0.0``), where nothing is anonymous.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from aiops.auth import (
    ADMIN_TOKEN_FILE,
    Authenticator,
    AuthError,
    Role,
    TokenStore,
    ensure_secret,
    stack_credential,
)
from aiops.config import Settings
from aiops.server.app import create_app
from aiops.server.guard import declared_routes
from aiops.store import Store
from tests.loopback import serving

ADMIN = "admin-token-0123456789abcdef"
PUBLIC_ROUTES = {"/healthz", "/readyz"}


@pytest.fixture
def exposed(tmp_path: Path) -> Iterator[tuple[str, Settings, dict[str, str], Store]]:
    """A server configured to bind beyond loopback, with a token of each kind."""
    settings = Settings(data_dir=tmp_path, server_host="0.0.0.0", analytics=False,
                        scrape_targets="", retention_hours=0, admin_token=ADMIN)
    tokens = TokenStore(tmp_path / "tokens.json")
    made = {"viewer": tokens.add("grafana", Role.VIEWER),
            "operator": tokens.add("sre", Role.OPERATOR),
            "admin": ADMIN,
            "ingest": tokens.add("app", None),
            "serve": stack_credential(tmp_path, "serve")}
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store)) as url:
            yield url, settings, made, store
    finally:
        store.close()


def test_every_route_declares_its_access(tmp_path: Path) -> None:
    store = Store(None)
    try:
        app = create_app(Settings(data_dir=tmp_path, analytics=False, scrape_targets="",
                                  retention_hours=0), store)
    finally:
        store.close()
    undeclared, public = [], set()
    routes = declared_routes(app)
    assert len(routes) > 15
    for path, kind, access in routes:
        assert kind == "APIRoute", f"{path} is a {kind}, not an API route with a guard"
        if access is None:
            undeclared.append(path)
        elif access == "public":
            public.add(path)
    assert undeclared == []
    assert public == PUBLIC_ROUTES


def _call(url: str, method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{url}{path}", headers=headers, timeout=30,
                         json={} if method == "POST" else None)


ROUTES = [
    ("GET", "/metrics", "viewer"),
    ("GET", "/metrics/otlp", "viewer"),
    ("GET", "/api/v1/incidents", "viewer"),
    ("GET", "/api/v1/actions", "viewer"),
    ("GET", "/api/v1/ledger/ledger/verify", "viewer"),
    ("GET", "/openapi.json", "viewer"),
    ("GET", "/docs", "viewer"),
    ("POST", "/api/v1/sql", "viewer"),
    ("POST", "/v1/chatops", "operator"),
    ("POST", "/api/v1/actions/act-1/approve", "admin"),
    ("POST", "/api/v1/rollouts", "admin"),
    ("POST", "/v1/traces", "ingest"),
]


@pytest.mark.parametrize(("method", "path", "needs"), ROUTES)
def test_beyond_loopback_nothing_is_anonymous_and_roles_are_enforced(
        exposed: tuple[str, Settings, dict[str, str], Store], method: str, path: str,
        needs: str) -> None:
    url, _, tokens, _ = exposed
    anonymous = _call(url, method, path, None)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert _call(url, method, path, "aiops_not-a-real-token-at-all").status_code == 401
    order = ["viewer", "operator", "admin"]
    for holder, token in tokens.items():
        if needs == "ingest":
            allowed = holder in ("ingest", "serve")
        else:
            allowed = holder in order and order.index(holder) >= order.index(needs)
        got = _call(url, method, path, token).status_code
        assert (got not in (401, 403)) == allowed, f"{holder} on {path}: {got}"


def test_health_stays_open_for_probes(
        exposed: tuple[str, Settings, dict[str, str], Store]) -> None:
    url = exposed[0]
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert httpx.get(f"{url}/readyz").status_code == 200


@pytest.mark.parametrize("header", [
    "Bearer \xa0".encode("latin-1"), "Bearer caf\xe9-token-123456789".encode("latin-1"),
    b"Bearer", b"Basic YWRtaW46YWRtaW4=", b"Bearer a b", b"Bearer " + b"x" * 600,
])
def test_malformed_credentials_are_401_never_500(
        exposed: tuple[str, Settings, dict[str, str], Store], header: bytes) -> None:
    r = httpx.get(f"{exposed[0]}/api/v1/incidents", headers={"authorization": header})
    assert r.status_code == 401, r.text


def test_an_empty_admin_token_file_authenticates_no_one(tmp_path: Path) -> None:
    (tmp_path / ADMIN_TOKEN_FILE).write_text("")
    settings = Settings(data_dir=tmp_path, server_host="0.0.0.0")
    auth = Authenticator.from_settings(settings)
    for token in ("\xa0", " ", ""):
        with pytest.raises(AuthError, match=r"empty|printable|unknown"):
            auth.authenticate(f"Bearer {token}")


def test_the_admin_token_file_is_never_seen_empty_while_it_is_made(tmp_path: Path) -> None:
    path = tmp_path / ADMIN_TOKEN_FILE
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(path.read_text())

    watcher = threading.Thread(target=watch)
    watcher.start()
    made = [ensure_secret(path) for _ in range(20)]
    time.sleep(0.05)
    stop.set()
    watcher.join()
    assert len(set(made)) == 1 and len(made[0]) >= 32
    assert seen and all(s == made[0] for s in seen)
    assert path.stat().st_mode & 0o777 == 0o600


def _provenance_log() -> bytes:
    return json.dumps({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{
        "logRecords": [{"timeUnixNano": str(time.time_ns()), "eventName": "aiops.provenance",
                        "body": {"stringValue": "forged"},
                        "attributes": [{"key": "model", "value": {"stringValue": "chat"}}]},
                       {"timeUnixNano": str(time.time_ns()), "body": {"stringValue": "ok"}}],
    }]}]}).encode()


def test_only_the_serving_stacks_credential_writes_provenance(
        exposed: tuple[str, Settings, dict[str, str], Store]) -> None:
    url, _, tokens, store = exposed
    for holder in ("ingest",):
        r = httpx.post(f"{url}/v1/logs", content=_provenance_log(),
                       headers={"content-type": "application/json",
                                "authorization": f"Bearer {tokens[holder]}"})
        assert r.status_code == 200
        assert r.json()["partialSuccess"]["rejectedLogRecords"] == "1"
    assert store.count("provenance") == 0
    assert store.count("logs") == 1
    r = httpx.post(f"{url}/v1/logs", content=_provenance_log(),
                   headers={"content-type": "application/json",
                            "authorization": f"Bearer {tokens['serve']}"})
    assert r.status_code == 200 and "partialSuccess" not in r.json()
    assert store.count("provenance") == 1


def test_on_loopback_anonymous_clients_read_and_export_but_never_write_provenance(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, analytics=False, scrape_targets="",
                        retention_hours=0)
    store = Store(settings.db_path)
    try:
        with serving(create_app(settings, store)) as url:
            assert httpx.get(f"{url}/api/v1/incidents").status_code == 200
            assert httpx.post(f"{url}/v1/chatops", json={"question": "hi"}).status_code == 401
            r = httpx.post(f"{url}/v1/logs", content=_provenance_log(),
                           headers={"content-type": "application/json"})
            assert r.status_code == 200
            assert store.count("provenance") == 0
    finally:
        store.close()


def test_revoked_tokens_stop_working_without_a_restart(
        exposed: tuple[str, Settings, dict[str, str], Store], tmp_path: Path) -> None:
    url, _, tokens, _ = exposed
    assert _call(url, "GET", "/api/v1/incidents", tokens["viewer"]).status_code == 200
    assert TokenStore(tmp_path / "tokens.json").revoke("grafana")
    assert _call(url, "GET", "/api/v1/incidents", tokens["viewer"]).status_code == 401


def _add_token(path: str, name: str) -> str:
    return TokenStore(Path(path)).add(name, Role.VIEWER)


def test_tokens_added_by_several_processes_at_once_are_all_kept(tmp_path: Path) -> None:
    """The Serve driver, the eBPF collector and the CLI edit tokens.json independently."""
    import multiprocessing

    path = tmp_path / "tokens.json"
    names = [f"p{i}" for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        tokens = pool.starmap(_add_token, [(str(path), n) for n in names])
    store = TokenStore(path)
    assert sorted(e["name"] for e in store.entries()) == names
    assert [p.name for p in map(store.lookup, tokens) if p is not None] == names

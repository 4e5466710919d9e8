"""Typed configuration, read once at start-up.

Sources, highest priority first: keyword arguments, ``AIOPS_*`` environment variables, the
TOML file named by ``AIOPS_CONFIG`` (or passed as ``config_file``), then defaults. The result is
a frozen object that is passed to whatever needs it; nothing reads the environment at import.
``docs/configuration.md`` is generated from this class (``aiops config docs``) and a test checks
that it is current.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from aiops.errors import ConfigError

__all__ = ["CONFIG_FILE_ENV", "ENV_PREFIX", "AttachTarget", "Settings", "load_settings",
           "settings_reference"]

ENV_PREFIX = "AIOPS_"
CONFIG_FILE_ENV = "AIOPS_CONFIG"
# Targets `aiops attach add` keeps, in the data directory (read and written by aiops.attach).
ATTACH_FILE = "attach.json"


class AttachTarget(BaseModel):
    """Serving that aiops observes and acts on without having started it (``aiops attach``):
    a Ray cluster (its dashboard address) or a vLLM OpenAI server (its base address)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ray", "vllm"]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$",
                      description="Name of the target, unique; the scrape job of its metrics.")
    url: str = Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=512,
                     description="Ray: the dashboard (`http://head:8265`); vLLM: the server "
                     "(`http://host:8000`).")
    token_file: Path | None = Field(None, description="File holding the bearer token the "
                                    "target wants (Ray's auth token; a vLLM `--api-key`).")
    metrics_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=512,
        description="Prometheus endpoint to scrape: Ray's `--metrics-export-port` "
        "(`http://head:8080/metrics`); for vLLM the default is `<url>/metrics`.")

    def token(self) -> str | None:
        """The target's token, read now (a rotated file is picked up), or None."""
        if self.token_file is None:
            return None
        try:
            value = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"attach target {self.name}: cannot read token file "
                              f"{self.token_file}: {exc.strerror or exc}") from exc
        if not value:
            raise ConfigError(f"attach target {self.name}: token file {self.token_file} is "
                              "empty")
        return value


class Settings(BaseSettings):
    """Every setting of aiops. Field descriptions are the user documentation."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # Where state lives.
    data_dir: Path = Field(
        Path(".aiops"),
        description="Directory for the DuckDB file, process state and logs of `aiops up`.",
    )
    db_file: str = Field(
        "telemetry.duckdb", description="DuckDB file name, relative to `data_dir`."
    )
    ledger_witness_file: Path | None = Field(
        None, description="File outside `data_dir` that the server appends each new head of "
        "the hash-chained tables (ledger, provenance) to, one JSON line each; `aiops ledger "
        "verify` checks the chain against every head in it, so an entry rewritten with its "
        "chain and anchor recomputed is still found. Make it a file the aiops process can "
        "only append to (`chattr +a` by root, or forwarded by another user's log shipper; "
        "docs/security.md). Empty: off, and whoever can write `data_dir` can rewrite the "
        "ledger undetected.")

    # The aiops server.
    server_host: str = Field("127.0.0.1", description="Address the aiops server binds.")
    server_port: int = Field(
        4318, ge=1, le=65535, description="Port of the aiops server (OTLP/HTTP's standard port)."
    )
    otlp_grpc_port: int = Field(
        4317, ge=0, le=65535, description="Port of the OTLP/gRPC receiver (OTLP's standard "
        "gRPC port), on `server_host`, with the HTTP side's tokens, limits and TLS; 0: no "
        "gRPC receiver.")
    server_tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) of the aiops server; set with "
        "`server_tls_key`, the server speaks HTTPS only and every aiops client uses https.")
    server_tls_key: Path | None = Field(
        None, description="PEM private key of `server_tls_cert`.")
    server_tls_ca: Path | None = Field(
        None, description="PEM CA bundle aiops clients (CLI, Serve replicas' OTLP exporters, "
        "the eBPF collector) verify the server's certificate against; set alone (no "
        "certificate or key: a machine that is only a client), clients use https. Empty: "
        "httpx's and requests' default bundle (certifi).")
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest accepted OTLP request body, before and after gzip (HTTP 413 above).",
    )
    ledger_verify_timeout_s: float = Field(
        60.0, gt=0, description="Longest a caller of `/api/v1/ledger/<table>/verify` waits; "
        "past it 503 (retry). One verification per table runs at a time, shared by every "
        "caller meanwhile.")
    remote_write_max_samples: int = Field(
        200_000, ge=1, description="Most samples one Prometheus remote write request may "
        "carry (Prometheus sends `max_samples_per_send`, 2,000 by default); past it 413. Rows "
        "are charged to the ingest budget per sample, not per compressed byte.")
    duckdb_memory_mb: int = Field(
        1024, ge=64, description="DuckDB's buffer pool limit (cached database blocks; beyond "
        "it DuckDB evicts to disk).")
    store_trace_index: bool = Field(
        False, description="An ART index on spans.trace_id: a trace of any age is found in "
        "about 1 ms instead of a scan of every span (about 200 ms at 10M spans); it costs "
        "about 50 bytes of disk and memory per span and makes span ingest into the store "
        "about 5x slower (docs/scaling.md). Off (the default), a trace lookup searches the "
        "last hour first. Turning it off drops the index.")
    server_memory_mb: int = Field(
        6144, ge=0, description="Cap on the aiops server's data memory (RLIMIT_DATA): an "
        "allocation past it fails (that query or request gets an error) instead of the "
        "kernel's OOM killer ending the server; 0: no cap.")
    ingest_memory_mb: int = Field(
        256, ge=8, description="Memory for OTLP bodies and decoded batches in flight; beyond "
        "it requests get a retryable 503 (Retry-After).")
    scrape_targets: str = Field(
        "ray", description="Prometheus targets the server scrapes: `job=url,...`; `ray` means "
        "the local Ray instance's metrics endpoint; empty disables scraping.")
    scrape_interval_s: float = Field(10.0, gt=0, description="Seconds between scrapes.")
    ray_metrics_port: int = Field(
        8090, ge=1, le=65535, description="Port Ray exports its (and Serve's) Prometheus "
        "metrics on.")
    retention_hours: float = Field(
        168.0, ge=0, description="Rows of spans, logs and metric points older "
        "than this move to Parquet under `<data_dir>/archive` (queryable as `<table>_all`); "
        "0 keeps everything in DuckDB.")
    retention_interval_s: float = Field(300.0, gt=0, description="Seconds between retention "
                                        "runs.")
    storage_backend: Literal["duckdb", "ducklake"] = Field(
        "duckdb", description="`duckdb`: one server, one DuckDB file (the default; nothing else "
        "to run). `ducklake`: several servers share one DuckLake (PostgreSQL catalog, Parquet "
        "on shared storage); each keeps its recent rows in its own file for detection and "
        "commits them to the lake, and `<table>_all` reads every server's (docs/scaling.md).")
    lake_catalog: str = Field(
        "", description="libpq connection string of the lake's PostgreSQL catalog database "
        "(`dbname=aiops_lake host=db.internal user=aiops`); keep the password in `~/.pgpass` "
        "or `PGPASSFILE`, not here.")
    lake_data_path: Path | None = Field(
        None, description="Directory of the lake's Parquet files, on storage every server "
        "mounts at the same path.")
    server_id: str = Field(
        "", max_length=128, description="This server's name in the lake, on every row it "
        "commits; stable across restarts (a restarted server resumes by it). Empty: "
        "`<hostname>:<server_port>`.")
    lake_commit_interval_s: float = Field(
        5.0, gt=0, le=3600, description="Seconds between commits of new rows to the lake.")
    lake_upkeep_interval_s: float = Field(
        3600.0, ge=0, description="Seconds between lake upkeep runs (merging small files, "
        "expiring snapshots older than an hour); 0: never.")
    sql_row_limit: int = Field(
        10_000, ge=1, description="Most rows the read-only SQL endpoint returns for one query."
    )
    sql_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Longest read-only SQL query (HTTP API and "
        "dashboards); it is interrupted after this and its thread freed (HTTP 408).")
    sql_max_result_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="Largest result of one read-only SQL query "
        "(Arrow bytes); a larger one is stopped (HTTP 413).")
    sql_max_concurrent: int = Field(
        4, ge=1, le=64, description="Read-only SQL queries run at once, on their own threads "
        "(never the ingest path's); more get a retryable 429.")
    ingest_read_timeout_s: float = Field(
        10.0, gt=0, description="Longest time to receive one OTLP request body; a slower "
        "upload gets HTTP 408 and its budget back.")
    server_allowed_hosts: str = Field(
        "", description="Comma-separated names the `Host` header of a request may carry "
        "(`*`: any). Empty: while the server binds loopback, the loopback names and this "
        "machine's name (a DNS-rebinding page is refused); bound beyond loopback, any.")
    server_header_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Longest time a connection may take to send a "
        "request's headers (the first request's, and each next one's); then it is closed.")
    server_max_connections_per_client: int = Field(
        256, ge=1, description="Connections one client address may hold open at once, HTTP "
        "and OTLP/gRPC together; past it a new HTTP connection gets 503 and is closed, a "
        "gRPC one is closed at accept (clients retry).")
    server_max_requests_per_token: int = Field(
        256, ge=1, description="Requests one token may have in flight at once, HTTP and "
        "OTLP/gRPC together; past it a retryable 503 (gRPC: UNAVAILABLE). Anonymous "
        "(loopback) callers are bounded by `server_max_connections_per_client` instead.")
    server_max_connections: int = Field(
        4096, ge=16, description="Connections open at once, HTTP and OTLP/gRPC together; a "
        "new one past it closes the longest-idle HTTP connection (no request in flight) or, "
        "with none idle, is refused (HTTP: retryable 503; gRPC: closed at accept).")
    sql_max_memory_mb: int = Field(
        1024, ge=16, description="Memory one read-only SQL query may add to the server "
        "(resident, sampled every 20 ms); past it the query is interrupted (HTTP 413). "
        "`server_memory_mb` stays the hard cap for allocations between two samples.")
    anonymous_on_loopback: bool = Field(
        True, description="While the server binds only a loopback address, a request "
        "without a token is a viewer and may export telemetry (never provenance). Beyond "
        "loopback every request needs a token, whatever this says.")
    token: str = Field(
        "", description="Bearer token aiops clients (CLI, `aiops ask`, dashboards push) send "
        "to the server; empty: the admin token when this machine has it.")
    log_level: str = Field("INFO", description="Log level of aiops processes.")

    # Ray and the Serve application.
    serve_host: str = Field("127.0.0.1", description="Address Ray Serve's HTTP proxy binds.")
    serve_port: int = Field(8000, ge=1, le=65535, description="Port of Ray Serve's HTTP proxy.")
    serve_proxy: Literal["serve", "haproxy"] = Field(
        "serve", description="What takes HTTP in front of the Serve app: `serve`, Serve's "
        "Python proxy (Ray's default), or `haproxy`, Ray Serve's high-throughput mode (HAProxy, "
        "gRPC between replicas: about half the CPU per request; docs/benchmarks.md \"Priority "
        "under load\"). `haproxy`: one node, plain HTTP; replicas' ports bind all interfaces.")
    control_port: int = Field(
        8001, ge=1, le=65535,
        description="Port of the Serve control plane's API (models apply/canary/promote/...).")
    admin_token: str = Field(
        "",
        description="Bearer token of the control plane API; empty: generated at start-up and "
        "written to `<data_dir>/admin.token` (mode 0600).")
    ray_num_cpus: int = Field(
        2, ge=1, description="CPUs the local Ray instance advertises to its scheduler (each "
        "node's, with worker nodes)."
    )
    ray_worker_nodes: int = Field(
        0, ge=0, le=4, description="Ray worker nodes to start beside the head on this "
        "machine (each its own raylet; Serve spreads replicas over them). 0: one local "
        "instance. With eBPF, one collector per node (docs/multinode.md).")
    models_file: Path | None = Field(
        None,
        description="Model spec YAML (see docs/models.md); empty means the packaged default "
        "`serve/models.yaml`.",
    )
    api_keys: str = Field(
        "",
        description="Comma-separated API keys for the OpenAI endpoints; empty disables auth.",
    )
    max_request_bytes: int = Field(
        20 * 1024 * 1024, ge=1024,
        description="Largest request body the OpenAI endpoints accept (HTTP 413 above).",
    )
    strict_packages: bool = Field(
        False, description="Serve only signed aiops packages that verify against "
        "`AIOPS_TRUSTED_KEYS` (refuse unsigned or tampered artifacts).")
    trusted_keys: str = Field(
        "", description="Comma-separated Ed25519 public key files (PEM) that may sign packages.")
    otlp_export_interval_s: float = Field(
        1.0,
        gt=0,
        description="How often Serve replicas flush spans, logs and metrics to the server.",
    )
    startup_timeout_s: float = Field(
        180.0, gt=0, description="How long `aiops up` waits for each component to become ready."
    )

    # Live analytics (in the server).
    analytics: bool = Field(True, description="Run the detectors and keep incidents in the "
                            "server.")
    analytics_interval_s: float = Field(1.0, gt=0, description="Seconds between analytics "
                                        "rounds.")
    analytics_window_s: float = Field(
        10.0, gt=0, description="Current window of the trace and eBPF detectors, seconds; "
        "compared with the 10 minutes before it (or with sibling versions).")
    analytics_burn_windows: str = Field(
        "60/10/6,600/60/3", description="SLO burn-rate window pairs `long/short/threshold` "
        "(seconds, seconds, burn rate), comma-separated; a pair fires when both windows burn "
        "faster than the threshold.")
    analytics_resolve_after_s: float = Field(
        30.0, gt=0, description="An incident resolves after this many seconds without a "
        "firing detector.")
    analytics_recovered_after_s: float = Field(
        10.0, gt=0, description="An incident an action was taken for (mitigating) resolves, "
        "and the action is verified, once no failed or slow request of it has ended for this "
        "many seconds (the detectors' window may still hold older ones).")

    policy_file: Path | None = Field(
        None, description="Remediation policy (YAML, see docs/remediation.md). Default: the "
        "packaged policy, which dry-runs every action.")

    # The eBPF collector (root only).
    ebpf: Literal["auto", "on", "off"] = Field(
        "auto", description="Start the eBPF collector with `aiops up`: `auto` when this machine "
        "allows it (root, BPF, tracefs, kernel headers; the reason is printed otherwise), `on` "
        "fails `aiops up` when it cannot start, `off` never.")
    ebpf_interval_s: float = Field(
        2.0, gt=0, description="Seconds between drains of the eBPF maps (one OTLP export each).")
    ebpf_max_entries: int = Field(
        8192, ge=64, description="Entries per eBPF map (processes, threads, devices, sockets); "
        "updates beyond it are counted as drops.")
    ebpf_node: str | None = Field(
        None, description="The Ray node (head, worker-1, ...) this eBPF collector covers: "
        "its replicas and the processes under its raylet. Empty: every process on the "
        "machine. `aiops up` sets it per collector when it starts worker nodes.")
    ebpf_kernel_source: Path | None = Field(
        None, description="Kernel header tree for bcc (`BCC_KERNEL_SOURCE`). Default: "
        "`/lib/modules/$(uname -r)/build` when present, else the merged Debian tree "
        "`make ebpf-headers` prepares in `.build/kernel-headers`.")

    # The chat-ops agent.
    agent_mode: Literal["plan", "tools"] = Field(
        "plan", description="`plan`: a fixed investigation plan, the LLM writes only the "
        "narrative (right for the embedded SmolLM2); `tools`: llama-index's function-calling "
        "agent drives the tools (needs a model that calls tools, e.g. vLLM on a GPU).")
    agent_llm_url: str = Field(
        "", description="OpenAI-compatible base URL of the agent's LLM. Empty: the embedded "
        "stack's own Serve endpoint (`<serve_url>/v1`) where this server expects that stack "
        "(`embedded_stack`), else no LLM: on an attach-only server `serve_url` is the attached "
        "team's app, not an LLM; `none`: no LLM (template narratives).")
    agent_llm_model: str = Field("aiops-agent", description="Model name sent to the agent's "
                                 "LLM endpoint. The default stack serves `aiops-agent` (the "
                                 "chat model's weights on a replica of its own, so agent calls "
                                 "never queue user requests); a stack without it can name "
                                 "its chat model here.")
    agent_llm_api_key: str = Field(
        "", description="API key for the agent's LLM endpoint. Empty: the first of "
        "`AIOPS_API_KEYS` (the stack's own), else none.")
    agent_timeout_s: float = Field(60.0, gt=0, description="Longest wait for one LLM call.")
    agent_llm_when_busy: Literal["skip", "ask"] = Field(
        "skip", description="skip: while the models are serving users (a request began in the "
        "last 10 s), an answer's narrative is the template's and the LLM is not asked, so "
        "chat-ops never slows served traffic; ask: the LLM is asked anyway.")
    agent_llm_priority: Literal["batch", "realtime", ""] = Field(
        "batch", description="Priority class the agent's LLM calls ask for at the Serve ingress "
        "(x-aiops-priority): batch waits behind every waiting user request; empty sends none.")
    agent_max_concurrent: int = Field(
        2, ge=1, description="Questions answered at once; more get HTTP 429 (Retry-After).")
    agent_sql_rows: int = Field(200, ge=1, description="Most rows an agent SQL lookup returns.")
    agent_sql_timeout_s: float = Field(5.0, gt=0, description="Longest agent SQL lookup; "
                                       "the statement is interrupted after it.")
    slack_signing_secret: str = Field(
        "", description="Signing secret of the Slack app; empty disables the Slack "
        "slash-command endpoint (`/v1/slack/command`).")
    slack_user_roles: str = Field(
        "", description="Roles of Slack users by Slack user id (not name): `U123=admin,"
        "U456=operator`. Anyone else may only ask (viewer): no proposals, no approvals.")
    slack_response_hosts: str = Field(
        "hooks.slack.com", description="Comma-separated hosts a Slack `response_url` may "
        "point at (the follow-up answer is posted there; anything else is refused).")

    # Serving aiops did not start (docs/attach.md).
    attach: tuple[AttachTarget, ...] = Field(
        (), max_length=64, description="Targets to observe and act on: in the TOML file "
        "`[[attach]]` tables (kind, name, url, token_file, metrics_url); `aiops attach add` "
        "keeps more in `<data_dir>/attach.json`.")
    service_map_file: Path | None = Field(
        None, description="Who calls whom, when traces do not say (YAML `calls: {caller: "
        "[callee, ...]}`): incidents group a caller's symptoms with its callee's and rank the "
        "callee first (docs/attach.md).")
    attach_interval_s: float = Field(5.0, gt=0, description="Seconds between reads of each "
                                     "attached Ray cluster's Serve applications.")
    attach_healthy_after_s: float = Field(
        60.0, gt=0, description="Seconds a Serve application's config must run with no open "
        "incident on it before aiops keeps it as the one a rollback re-applies.")
    embedded_stack: Literal["auto", "on", "off"] = Field(
        "auto", description="Whether this server expects the Serve stack `aiops up` starts "
        "(its control plane on `control_port`, Ray's metrics as scrape target `ray`): `on` "
        "(what `aiops up` sets), `off` (an attach-only server), `auto`: expected unless attach "
        "targets are configured or added.")

    @property
    def embedded_expected(self) -> bool:
        """Whether the Serve stack of ``aiops up`` is expected beside this server, as it starts:
        ``embedded_stack`` when on or off; ``auto``: yes unless it watches attached serving,
        configured (``attach``) or added with `aiops attach add` (``<data_dir>/attach.json``
        holding any target; a file that cannot be read means attach-only was meant). The
        server re-asks the same of ``aiops.server.app._embedded`` while it runs."""
        if self.embedded_stack != "auto":
            return self.embedded_stack == "on"
        if self.attach:
            return False
        try:
            raw = (self.data_dir / ATTACH_FILE).read_bytes()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        try:
            return bool(json.loads(raw) == [])  # `aiops attach remove` of the last one
        except ValueError:
            return False

    @property
    def agent_llm_base(self) -> str | None:
        """The agent's LLM base URL, or None for no LLM (template narratives).

        Only a configured LLM is ever called: ``agent_llm_url`` when set, else the embedded
        stack's own Serve endpoint, which serves the agent's model, and that only where the
        stack is expected. On an attach-only server ``serve_url`` is nobody's LLM (at best
        the attached team's own app, which must not receive incident data): no LLM."""
        url = self.agent_llm_url.strip()
        if url.lower() == "none":
            return None
        if url:
            return self.agent_llm_url
        return f"{self.serve_url}/v1" if self.embedded_expected else None

    @property
    def db_path(self) -> Path:
        return self.data_dir / self.db_file

    @model_validator(mode="after")
    def _lake_named(self) -> Settings:
        if self.storage_backend == "ducklake" and not (self.lake_catalog
                                                       and self.lake_data_path):
            raise ValueError("storage_backend = ducklake needs lake_catalog and lake_data_path")
        return self

    @model_validator(mode="after")
    def _haproxy_one_node(self) -> Settings:
        if self.serve_proxy == "haproxy" and self.ray_worker_nodes:
            raise ValueError("serve_proxy = haproxy runs on one node here (ray_worker_nodes = 0):"
                             " nodes on one machine would share HAProxy's files")
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> Settings:
        """TLS needs a certificate and its key together, and every named file readable now,
        not when the first client connects."""
        if (self.server_tls_cert is None) != (self.server_tls_key is None):
            raise ValueError("server_tls_cert and server_tls_key must be set together")
        for name in ("server_tls_cert", "server_tls_key", "server_tls_ca"):
            path: Path | None = getattr(self, name)
            if path is None:
                continue
            try:
                with path.open("rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"{name}: {path} is not a readable file "
                                 f"({exc.strerror or exc})") from exc
        return self

    @field_validator("ledger_witness_file", mode="before")
    @classmethod
    def _empty_is_off(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _witness_outside_data_dir(self) -> Settings:
        """A witness that the data directory holds is rewritten with it."""
        witness = self.ledger_witness_file
        if witness is not None:
            data = self.data_dir.expanduser().resolve()
            if data in (witness.expanduser().resolve(), *witness.expanduser().resolve().parents):
                raise ValueError(f"ledger_witness_file ({witness}) must be outside data_dir "
                                 f"({self.data_dir}): whoever can write data_dir could "
                                 "rewrite it together with the ledger")
        return self

    @model_validator(mode="after")
    def _token_lengths(self) -> Settings:
        """A configured token is a secret only if it cannot be guessed."""
        for name in ("admin_token", "token"):
            value = getattr(self, name)
            if value and len(value) < 16:
                raise ValueError(f"{name} must be at least 16 characters (got {len(value)})")
        return self

    @property
    def server_tls(self) -> bool:
        """Whether the server speaks HTTPS (its certificate is here, or only its CA)."""
        return self.server_tls_cert is not None or self.server_tls_ca is not None

    @property
    def server_url(self) -> str:
        scheme = "https" if self.server_tls else "http"
        return f"{scheme}://{self.server_host}:{self.server_port}"

    @property
    def serve_url(self) -> str:
        return f"http://{self.serve_host}:{self.serve_port}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _CONFIG_FILE_OVERRIDE.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


# Set only for the duration of one ``load_settings`` call; pydantic-settings builds sources
# from the class, so this is how a per-call file reaches ``settings_customise_sources``.
_CONFIG_FILE_OVERRIDE: dict[str, Path] = {}


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Read the configuration once; raise ``ConfigError`` naming the source and field."""
    env_file = os.environ.get(CONFIG_FILE_ENV)
    path = config_file or (Path(env_file) if env_file else None)
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        if path is not None:
            _CONFIG_FILE_OVERRIDE["path"] = path
        return Settings(**overrides)
    except ValidationError as exc:
        where = f"config file {path} / environment" if path else "environment"
        problems = "; ".join(
            f"{ENV_PREFIX}{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            if err["loc"] else str(err["msg"]).removeprefix("Value error, ")
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    finally:
        _CONFIG_FILE_OVERRIDE.clear()


def settings_reference() -> str:
    """Markdown table of every setting: the source of docs/configuration.md."""
    lines = [
        "# Configuration",
        "",
        "Generated by `aiops config docs` from `aiops/config.py`; a test fails when it is stale.",
        "",
        f"Settings come from keyword arguments, then `{ENV_PREFIX}*` environment variables, then "
        f"the TOML file named by `{CONFIG_FILE_ENV}` (keys are the field names in lower case), "
        "then the defaults below. They are read once at start-up.",
        "",
        "| environment variable | default | meaning |",
        "|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        lines.append(f"| `{ENV_PREFIX}{name.upper()}` | `{default}` | {field.description} |")
    lines.append(
        f"| `{CONFIG_FILE_ENV}` | (none) | Path of a TOML file with any of the settings above. |"
    )
    return "\n".join(lines) + "\n"

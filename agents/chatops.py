"""Chat-ops over HTTP: ``POST /v1/chatops`` (JSON) and a Slack-compatible slash command
(``POST /v1/slack/command``).

Both ask the same agent, with the asker's role (``aiops.auth.Role``): a viewer may ask, an
operator may also propose actions (the remediation policy still decides), an admin may also
approve or deny pending ones ("approve act-..."). ``/v1/chatops`` needs an operator token
(its role is the token's); a Slack request is signed with the app's signing secret, used
once (a replay within the five-minute window is refused, a restart included: the signatures
used are on disk, ``agents.slack_replay``), and its role is that of the Slack user id in
``slack_user_roles`` (anyone else: viewer). Whatever a Slack request holds, the answer is a
4xx, never a 500: its headers are checked before its body is read, the body is read up to
its cap and no further, and it is parsed only once its signature holds. Slack wants an
answer within 3 s, so the command is acknowledged at once and the full answer is posted to
its ``response_url`` (only to the hosts ``slack_response_hosts`` allows) when it is ready.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from agents.agent import Agent, Answer, make_llm
from agents.memory import LazyMemory
from agents.settings import AgentSettings, SlackSettings
from agents.slack_replay import SeenSignatures
from agents.tools import Limits, Proposer, Toolbox
from aiops.analytics.findings import Finding
from aiops.analytics.slo import Objective
from aiops.auth import Access, Role
from aiops.capacity import Capacity
from aiops.errors import AIOpsError, ConfigError
from aiops.remediation.actions import Action
from aiops.store import Store

if TYPE_CHECKING:
    from fastapi.params import Depends
    from llama_index.core.llms import LLM

__all__ = ["AgentService", "ChatRequest", "NotAllowed", "make_router", "slack_roles"]

log = logging.getLogger(__name__)

SLACK_MAX_BODY = 8 * 1024
SLACK_WINDOW_S = 60 * 5  # Slack's rule: a timestamp this far from now, either way, at most
SLACK_SEEN_MAX = 10_000  # signatures remembered at most; when full, new requests wait (503)
SLACK_MAX_FIELDS = 32  # a slash command has a dozen
_SLACK_USER_ID = re.compile(r"^[A-Z0-9]{2,32}$")  # U012AB3CD, W0123ABC
_SLACK_STAMP = re.compile(r"[0-9]{1,12}")  # Unix seconds, ASCII digits (str.isdigit takes "²")
_SLACK_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")


class Busy(Exception):
    """Every answering slot is taken."""


class NotAllowed(AIOpsError):
    """The asker's role does not allow proposing or deciding actions."""


class ChatRequest(BaseModel):
    question: str = Field(min_length=1, max_length=2000)
    user: str = Field("api", min_length=1, max_length=64, pattern=r"^[\w.@-]+$")


Decide = Callable[[str, bool, str, int], dict[str, Any]]


class _Acting:
    """The remediator as the agent's proposer and approver, with the analyzer's tracker."""

    def __init__(self, propose: Callable[[Action, str, int], dict[str, Any]],
                 decide: Decide | None) -> None:
        self._propose, self._decide = propose, decide

    def propose(self, action: Action, actor: str, now_ns: int) -> dict[str, Any]:
        return self._propose(action, actor, now_ns)

    def decide(self, action_id: str, approve: bool, actor: str, now_ns: int
               ) -> dict[str, Any]:
        if self._decide is None:
            raise ValueError("approvals are not available here")
        return self._decide(action_id, approve, actor, now_ns)


class _AsRole:
    """The proposer as one asker may use it: proposing needs the operator role, approving or
    denying the admin role (the tools report the refusal as the reason)."""

    def __init__(self, proposer: Proposer, role: Role | None, actor: str) -> None:
        self._proposer, self._role, self._actor = proposer, role, actor

    def _need(self, role: Role, what: str) -> None:
        if self._role is None or self._role < role:
            have = self._role.label if self._role is not None else "no role"
            raise NotAllowed(f"{what} needs the {role.label} role; {self._actor} has {have}")

    def propose(self, action: Action, actor: str, now_ns: int) -> dict[str, Any]:
        self._need(Role.OPERATOR, "proposing actions")
        return self._proposer.propose(action, actor, now_ns)

    def decide(self, action_id: str, approve: bool, actor: str, now_ns: int
               ) -> dict[str, Any]:
        self._need(Role.ADMIN, "approving or denying actions")
        return self._proposer.decide(action_id, approve, actor, now_ns)


class AgentService:
    """Builds an agent per question (its toolbox names the asker) and bounds concurrency."""

    def __init__(self, settings: AgentSettings, store: Store,
                 propose: Callable[[Action, str, int], dict[str, Any]] | None = None,
                 decide: Decide | None = None, objectives: Sequence[Objective] = (),
                 models: Sequence[str] = (), memory: LazyMemory | None = None,
                 slack: SlackSettings | None = None, capacities: Sequence[Capacity] = (),
                 findings: Callable[[], Sequence[Finding]] | None = None) -> None:
        self.settings = settings
        self.findings = findings  # the analyzer's findings that are not pages
        self.slack = slack or SlackSettings()
        self.memory = memory
        self.store = store
        self.objectives = tuple(objectives)
        self.models = tuple(models)  # declared in the specs: known before any traffic
        self.capacities = tuple(capacities)  # the specs' limits, for answers about use
        self.proposer: Proposer | None = _Acting(propose, decide) if propose else None
        self._slots = threading.BoundedSemaphore(settings.max_concurrent)
        self._llm: LLM | None = None

    @property
    def llm(self) -> LLM | None:
        """The agent's LLM client, made on first use (llama-index is slow to import)."""
        s = self.settings
        if self._llm is None and s.llm_base:
            self._llm = make_llm(s.llm_base, s.llm_model, s.llm_api_key, s.timeout_s,
                                 function_calling=s.mode == "tools", priority=s.priority)
        return self._llm

    def ask(self, question: str, actor: str, role: Role | None) -> Answer:
        """Answer as ``actor`` with ``role``: operator may propose actions, admin may also
        approve or deny pending ones; a refusal is the answer's reason."""
        if not self._slots.acquire(blocking=False):
            raise Busy
        try:
            s = self.settings
            proposer = _AsRole(self.proposer, role, actor) if self.proposer else None
            box = Toolbox(self.store, proposer,
                          Limits(sql_rows=s.sql_rows, sql_timeout_s=s.sql_timeout_s),
                          actor=actor, objectives=self.objectives, models=self.models,
                          memory=self.memory, capacities=self.capacities,
                          findings=self.findings, own_models=(s.llm_model,))
            return Agent(box, self.llm, s.mode, s.when_busy).ask(question)
        finally:
            self._slots.release()


def slack_roles(spec: str) -> dict[str, Role]:
    """``U123=admin,U456=operator`` as {user id: role}; a malformed value is a ConfigError."""
    roles: dict[str, Role] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        user, sep, name = (part.strip() for part in item.partition("="))
        if not sep or not _SLACK_USER_ID.match(user):
            raise ConfigError(f"AIOPS_SLACK_USER_ROLES: {item.strip()!r} is not <Slack user "
                              "id>=<role> (ids are upper-case letters and digits, U012AB3CD)")
        try:
            role = Role.parse(name)
        except ValueError as exc:
            raise ConfigError(f"AIOPS_SLACK_USER_ROLES: {user}: {exc}") from None
        if roles.get(user, role) != role:
            raise ConfigError(f"AIOPS_SLACK_USER_ROLES: {user} is given two roles")
        roles[user] = role
    return roles


_Seen = SeenSignatures  # the name the tests know


def _role(request: Request) -> Role | None:
    principal = getattr(request.state, "principal", None)
    return principal.role if principal is not None else None


def make_router(service: AgentService, guards: Callable[[Access], Depends]) -> APIRouter:
    """The chat-ops routes: ``/v1/chatops`` for operators (and admins), the Slack command
    guarded by its signature; a malformed ``slack_user_roles`` is a ConfigError here.
    ``guards(access)`` is the server's route dependency for that access level
    (``aiops.server.guard.Guards``, passed in: the agent does not import the server)."""
    router = APIRouter()
    slack = service.slack
    hosts = slack.response_hosts
    roles = slack_roles(slack.user_roles)
    # On disk only when Slack is on; a record that cannot be read is a ConfigError here.
    seen = SeenSignatures(SLACK_WINDOW_S, SLACK_SEEN_MAX, path=slack.seen_file)

    @router.post("/v1/chatops", dependencies=[guards("operator")])
    async def chatops(body: ChatRequest, request: Request) -> JSONResponse:
        """Ask a question; the answer has facts, evidence ids and a narrative. An operator
        may propose actions (the policy decides), an admin also approve pending ones."""
        # The ledger names the token that asked, then the user it says it speaks for.
        principal = getattr(request.state, "principal", None)
        holder = principal.name if principal is not None else "anonymous"
        actor = f"agent:{body.user}" if holder == "admin" else f"agent:{holder}/{body.user}"
        try:
            answer = await run_in_threadpool(service.ask, body.question, actor, _role(request))
        except Busy:
            return JSONResponse({"error": "the agent is answering other questions; retry"},
                                status_code=429, headers={"Retry-After": "5"})
        return JSONResponse(answer.model_dump(mode="json"))

    @router.post("/v1/slack/command", dependencies=[guards("slack")])
    async def slack_command(request: Request) -> JSONResponse:
        secret = slack.signing_secret
        if not secret:
            return JSONResponse({"error": "the Slack endpoint is off: set "
                                 "AIOPS_SLACK_SIGNING_SECRET"}, status_code=404)
        # The headers first: nothing of the body is read for a request that cannot be valid.
        stamp = request.headers.get("x-slack-request-timestamp", "")
        if not _SLACK_STAMP.fullmatch(stamp):
            return _unauthorized("X-Slack-Request-Timestamp is not a Unix time in seconds")
        if abs(time.time() - int(stamp)) > SLACK_WINDOW_S:
            return _unauthorized("the Slack request timestamp is more than five minutes "
                                 "from now")
        signature = request.headers.get("x-slack-signature", "")
        if not _SLACK_SIGNATURE.fullmatch(signature):
            return _unauthorized("invalid or expired Slack signature")
        body = await _read_capped(request, SLACK_MAX_BODY)
        if isinstance(body, JSONResponse):
            return body
        # Over the raw bytes, as Slack signs them; the body is decoded only once it holds.
        mac = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256)
        if not hmac.compare_digest(f"v0={mac.hexdigest()}".encode(), signature.encode()):
            return _unauthorized("invalid or expired Slack signature")
        try:  # on disk before the request is accepted (fsync: a thread, not the event loop)
            wait = await run_in_threadpool(seen.use, signature, int(stamp))
        except OSError as exc:
            log.error("cannot record a Slack signature: %s", exc)
            return JSONResponse({"error": "cannot record the Slack request; retry"},
                                status_code=503, headers={"Retry-After": "5"})
        if wait == 0:
            return _unauthorized("replayed request")
        if wait is not None:
            return JSONResponse({"error": "too many Slack requests in five minutes; retry"},
                                status_code=503,
                                headers={"Retry-After": str(math.ceil(wait))})
        try:
            fields = parse_qs(body.decode("utf-8"), max_num_fields=SLACK_MAX_FIELDS)
        except UnicodeDecodeError:
            return JSONResponse({"error": "body is not UTF-8 form data"}, status_code=400)
        except ValueError:  # more fields than a slash command has
            return JSONResponse({"error": f"body has more than {SLACK_MAX_FIELDS} form "
                                 "fields"}, status_code=400)
        form = {k: v[0] for k, v in fields.items()}
        text = form.get("text", "").strip()[:2000]
        url = form.get("response_url", "")
        # The user id decides (a display name is anyone's to choose); unmapped: viewer.
        user_id = form.get("user_id", "")
        user = user_id if _SLACK_USER_ID.match(user_id) else "unknown"
        role = roles.get(user, Role.VIEWER)
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme, parts.hostname
        except ValueError:  # "http://[::1" is no URL
            scheme, host = "", None
        if scheme not in ("http", "https") or (host or "").lower() not in hosts:
            return JSONResponse({"error": f"response_url host {host!r} is not "
                                 "allowed (AIOPS_SLACK_RESPONSE_HOSTS)"}, status_code=400)
        if not text:
            text = "help"
        threading.Thread(target=_follow_up, args=(service, text, f"slack:{user}", role, url),
                         daemon=True, name="slack-follow-up").start()
        return JSONResponse({"response_type": "ephemeral",
                             "text": f"Looking into: {text}"})

    return router


def _unauthorized(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=401)


async def _read_capped(request: Request, cap: int) -> bytes | JSONResponse:
    """The body, read as it streams in and no further than ``cap`` bytes: past it, 413 (and
    the connection closes: the rest is never read)."""
    close = {"connection": "close"}
    declared = request.headers.get("content-length")
    if declared is not None:
        if not _CONTENT_LENGTH.fullmatch(declared):
            return JSONResponse({"error": "bad Content-Length"}, status_code=400,
                                headers=close)
        if int(declared) > cap:
            return JSONResponse({"error": f"slash command body over {cap // 1024} KiB"},
                                status_code=413, headers=close)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                return JSONResponse({"error": f"slash command body over {cap // 1024} KiB"},
                                    status_code=413, headers=close)
            chunks.append(chunk)
    except ClientDisconnect:
        return JSONResponse({"error": "the client went away"}, status_code=400, headers=close)
    return b"".join(chunks)


def _follow_up(service: AgentService, text: str, actor: str, role: Role, url: str) -> None:
    """Answer, then post it where Slack said; a failure to post is logged (Slack shows
    nothing more, and the question can be asked again)."""
    started = time.monotonic()
    try:
        answer = service.ask(text, actor, role)
        message = {"response_type": "in_channel", "text": answer.text}
    except Busy:
        message = {"response_type": "ephemeral",
                   "text": "The agent is busy with other questions; ask again in a moment."}
    except Exception as exc:
        log.exception("slack question failed")
        message = {"response_type": "ephemeral", "text": f"Sorry, that failed: {exc}"}
    try:
        httpx.post(url, json=message, timeout=10).raise_for_status()
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        log.warning("cannot post the answer to %s: %s", url, exc)
    log.info("slack answer for %s in %.1f s", actor, time.monotonic() - started)

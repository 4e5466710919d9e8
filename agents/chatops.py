"""Chat-ops over HTTP: ``POST /v1/chatops`` (JSON) and a Slack-compatible slash command
(``POST /v1/slack/command``).

Both ask the same agent. Asking is free; acting is not: a JSON caller proposes actions only
with the admin token, a Slack caller only through a request signed with the app's signing
secret, and in both cases the remediation policy decides. Slack wants an answer within 3 s,
so the command is acknowledged at once and the full answer is posted to its
``response_url`` (only to the hosts ``slack_response_hosts`` allows) when it is ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from slack_sdk.signature import SignatureVerifier

from agents.agent import Agent, Answer, make_llm
from agents.tools import Limits, Proposer, Toolbox
from aiops.config import Settings
from aiops.remediation.actions import Action
from aiops.store import Store

if TYPE_CHECKING:
    from llama_index.core.llms import LLM

__all__ = ["AgentService", "ChatRequest", "make_router"]

log = logging.getLogger(__name__)

SLACK_MAX_BODY = 8 * 1024


class Busy(Exception):
    """Every answering slot is taken."""


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


class AgentService:
    """Builds an agent per question (its toolbox names the asker) and bounds concurrency."""

    def __init__(self, settings: Settings, store: Store,
                 propose: Callable[[Action, str, int], dict[str, Any]] | None = None,
                 decide: Decide | None = None) -> None:
        self.settings = settings
        self.store = store
        self.proposer: Proposer | None = _Acting(propose, decide) if propose else None
        self._slots = threading.BoundedSemaphore(settings.agent_max_concurrent)
        self._llm: LLM | None = None

    @property
    def llm(self) -> LLM | None:
        """The agent's LLM client, made on first use (llama-index is slow to import)."""
        s = self.settings
        if self._llm is None and s.agent_llm_base:
            key = s.agent_llm_api_key or next(
                (k.strip() for k in s.api_keys.split(",") if k.strip()), "none")
            self._llm = make_llm(s.agent_llm_base, s.agent_llm_model, key, s.agent_timeout_s,
                                 function_calling=s.agent_mode == "tools")
        return self._llm

    def ask(self, question: str, actor: str, may_act: bool) -> Answer:
        if not self._slots.acquire(blocking=False):
            raise Busy
        try:
            s = self.settings
            box = Toolbox(self.store, self.proposer if may_act else None,
                          Limits(sql_rows=s.agent_sql_rows, sql_timeout_s=s.agent_sql_timeout_s),
                          actor=actor)
            return Agent(box, self.llm, s.agent_mode).ask(question)
        finally:
            self._slots.release()


def make_router(service: AgentService, is_admin: Callable[[Request], bool]) -> APIRouter:
    router = APIRouter()
    settings = service.settings
    hosts = {h.strip().lower() for h in settings.slack_response_hosts.split(",") if h.strip()}

    @router.post("/v1/chatops")
    async def chatops(body: ChatRequest, request: Request) -> JSONResponse:
        """Ask a question; the answer has facts, evidence ids and a narrative. Proposals of
        actions need the admin token (and the policy's consent)."""
        try:
            answer = await run_in_threadpool(service.ask, body.question, f"agent:{body.user}",
                                             is_admin(request))
        except Busy:
            return JSONResponse({"error": "the agent is answering other questions; retry"},
                                status_code=429, headers={"Retry-After": "5"})
        return JSONResponse(answer.model_dump(mode="json"))

    @router.post("/v1/slack/command")
    async def slack_command(request: Request) -> JSONResponse:
        if not settings.slack_signing_secret:
            return JSONResponse({"error": "the Slack endpoint is off: set "
                                 "AIOPS_SLACK_SIGNING_SECRET"}, status_code=404)
        body = await request.body()
        if len(body) > SLACK_MAX_BODY:
            return JSONResponse({"error": "slash command body over 8 KiB"}, status_code=413)
        verifier = SignatureVerifier(settings.slack_signing_secret)
        stamp = request.headers.get("x-slack-request-timestamp", "")
        if not stamp.isdigit() or not verifier.is_valid(
                body, stamp, request.headers.get("x-slack-signature", "")):
            return JSONResponse({"error": "invalid or expired Slack signature"},
                                status_code=401)
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        text = form.get("text", "").strip()[:2000]
        url = form.get("response_url", "")
        user = "".join(c for c in form.get("user_name", "slack") if c.isalnum() or c in "._-")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or (parts.hostname or "").lower() not in hosts:
            return JSONResponse({"error": f"response_url host {parts.hostname!r} is not "
                                 "allowed (AIOPS_SLACK_RESPONSE_HOSTS)"}, status_code=400)
        if not text:
            text = "help"
        threading.Thread(target=_follow_up, args=(service, text, f"slack:{user or 'slack'}",
                                                  url), daemon=True,
                         name="slack-follow-up").start()
        return JSONResponse({"response_type": "ephemeral",
                             "text": f"Looking into: {text}"})

    return router


def _follow_up(service: AgentService, text: str, actor: str, url: str) -> None:
    """Answer, then post it where Slack said; a failure to post is logged (Slack shows
    nothing more, and the question can be asked again)."""
    started = time.monotonic()
    try:
        answer = service.ask(text, actor, may_act=True)
        message = {"response_type": "in_channel", "text": answer.text}
    except Busy:
        message = {"response_type": "ephemeral",
                   "text": "The agent is busy with other questions; ask again in a moment."}
    except Exception as exc:
        log.exception("slack question failed")
        message = {"response_type": "ephemeral", "text": f"Sorry, that failed: {exc}"}
    try:
        httpx.post(url, json=message, timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("cannot post the answer to %s: %s", url, exc)
    log.info("slack answer for %s in %.1f s", actor, time.monotonic() - started)

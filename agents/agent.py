"""The chat-ops agent: a question in, an answer with facts, evidence and a narrative out.

Two paths over the same tools:

- ``plan`` (default; the embedded SmolLM2): rules and constrained generation read the
  question, the deterministic plan (``agents.investigate``) establishes the facts, and the LLM
  only writes the narrative (``agents.narrate``).
- ``tools``: a capable OpenAI-compatible model (vLLM on a GPU, or any endpoint) drives
  llama-index's ``FunctionAgent`` over the same tools. The plan still runs, so the answer's
  facts never depend on the model.

Either way, actions go through ``propose_action`` and so through the remediation policy.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agents.intent import TELEMETRY_KINDS, Intent, IntentKind, Reader, intent_schema, parse_rules
from agents.intent_knn import read_by_examples
from agents.investigate import Findings, Investigation, investigate
from agents.narrate import SYSTEM_PROMPT, Narrative, llm_narrative, template_narrative
from agents.questions import Report, explain_without_incident
from agents.questions import answer as answer_question
from agents.tools import Toolbox, ToolResult, ToolStatus
from aiops import semconv
from aiops.errors import AIOpsError

if TYPE_CHECKING:
    from llama_index.core.llms import LLM

__all__ = ["Agent", "Answer", "make_llm"]

Mode = Literal["plan", "tools"]

HELP = ("Ask about incidents and models, e.g. 'what happened to smollm2-135m-instruct in the "
        "last 15 minutes?', 'list open incidents', 'explain inc-...', 'roll back <model>'; "
        "or about the telemetry: 'p99 latency of the chat model over the last 10 minutes', "
        "'slowest traces', 'failed requests', 'top error logs', 'new log templates', 'what "
        "changed in the last hour', 'compare v1 and v2', 'is minilm saturated', 'tokens per "
        "second', 'error budget left' (in Chinese too: '聊天模型过去十分钟的P99延迟'). "
        "Actions go through the remediation policy.")


class Step(BaseModel):
    tool: str
    status: str
    params: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class Answer(Findings):
    question: str
    narrative: Narrative
    steps: list[Step] = Field(default_factory=list)
    mode: Mode
    elapsed_s: float = 0.0
    text: str = ""  # the whole answer as Markdown (Slack, JSON clients)


PRIORITY_HEADER = "x-aiops-priority"  # serve.ingress reads it


def make_llm(url: str, model: str, api_key: str = "none", timeout_s: float = 60.0,
             function_calling: bool = False, priority: str = "batch") -> LLM:
    """An OpenAI-compatible chat model through llama-index (the Serve endpoint, vLLM, ...).
    ``priority``: the class its requests ask for at the aiops ingress (``batch``: they wait
    behind every user request waiting for the same model); other endpoints ignore it."""
    from llama_index.llms.openai_like import OpenAILike

    headers = {PRIORITY_HEADER: priority} if priority else None
    llm: LLM = OpenAILike(model=model, api_base=url, api_key=api_key or "none",
                          is_chat_model=True, is_function_calling_model=function_calling,
                          context_window=2048, timeout=timeout_s, max_retries=1,
                          default_headers=headers)
    return llm


BUSY_WINDOW_S = 10.0  # "busy": a user request to a model began this recently


class Agent:
    def __init__(self, toolbox: Toolbox, llm: LLM | None = None, mode: Mode = "plan",
                 when_busy: Literal["ask", "skip"] = "ask",
                 reader: Reader | None = read_by_examples) -> None:
        self.box = toolbox
        self.llm = llm
        self.mode = mode
        # The nearest labelled examples read a topic no keyword names (agents.intent_knn).
        self.reader = reader
        # "skip": no narrative from the LLM while models serve users (the template's, with
        # the reason): the facts never need it, and on a small machine it slows them.
        self.when_busy = when_busy

    # -- what the store knows -----------------------------------------------------------------

    def known_models(self) -> list[str]:
        rows = self.box.query(
            f"SELECT DISTINCT service_name FROM spans WHERE {semconv.NOT_INGRESS_SQL} "
            "UNION SELECT DISTINCT service FROM incidents_current ORDER BY 1", [], 200).rows
        seen = [r[0] for r in rows if r[0]]
        return sorted({*seen, *self.box.models, *(o.model for o in self.box.objectives)})

    def known_versions(self) -> list[str]:
        rows = self.box.query(
            f"SELECT DISTINCT {semconv.VERSION} FROM spans", [], 200).rows
        return [r[0] for r in rows if r[0]]

    # -- reading the question -----------------------------------------------------------------

    def parse(self, question: str, models: list[str]) -> Intent:
        intent = parse_rules(question, models, self.reader)
        if intent is not None:
            return intent
        if self.llm is not None:
            read = self._llm_intent(question, models)
            if read is not None:
                return read
        return Intent(kind=IntentKind.INVESTIGATE)

    def _llm_intent(self, question: str, models: list[str]) -> Intent | None:
        from llama_index.core.llms import ChatMessage

        assert self.llm is not None
        fmt = {"type": "json_schema", "json_schema": {
            "name": "intent", "schema": intent_schema(models), "strict": True}}
        try:
            reply = self.llm.chat([
                ChatMessage(role="system", content="Classify the SRE's question. Reply JSON."),
                ChatMessage(role="user", content=question)],
                response_format=fmt, max_tokens=48, temperature=0.0)
            body = json.loads(reply.message.content or "", strict=False)
            model = body["model"] if body["model"] in models else None
            return Intent(kind=IntentKind(body["intent"]), model=model,
                          minutes=float(body["minutes"]), source="llm")
        except Exception:  # noqa: BLE001 - an unreadable reply falls back to the default
            return None

    # -- answering ---------------------------------------------------------------------------

    def ask(self, question: str) -> Answer:
        started = time.monotonic()
        try:
            models, versions = self.known_models(), self.known_versions()
        except AIOpsError:
            models, versions = [], []
        intent = self.parse(question, models)
        if intent.kind in TELEMETRY_KINDS:
            inv = Investigation(intent=intent, report=answer_question(self.box, intent, question))
        else:
            inv = investigate(self.box, intent)
            if intent.kind is IntentKind.INVESTIGATE and inv.facts is None \
                    and intent.model is not None:
                # No incident names it, yet something prompted the question: what its
                # requests show (slow minutes, spans that grew, changes), not "no incident".
                inv.report = explain_without_incident(self.box, intent, question)
        if inv.report is not None:
            narrative = Narrative(text=_report_summary(inv.report), source="template")
        elif intent.kind is IntentKind.HELP:
            narrative = Narrative(text=HELP, source="template")
        elif intent.kind is IntentKind.DECIDE_ACTION:
            p = inv.proposal
            verdict = "approve" if intent.approve else "deny"
            if p is None or not p.ok:
                why = p.error if p is not None else "no decision was made"
                text = f"Could not {verdict} {intent.action_id}: {why}"
            else:
                text = (f"{intent.action_id} ({p.data.get('description')}): "
                        f"{p.data.get('status')}.")
            narrative = Narrative(text=text, source="template")
        elif self.mode == "tools" and self.llm is not None:
            narrative = self._function_calling(question, inv)
        elif self.llm is not None and inv.facts is not None and (busy := self._busy()):
            narrative = template_narrative(inv).model_copy(update={"rejected": (
                f"the LLM was not asked: {busy} user request(s) in the last "
                f"{BUSY_WINDOW_S:g} s, which its work would slow (AIOPS_AGENT_LLM_WHEN_BUSY=ask "
                "asks anyway)")})
        elif self.llm is not None:
            narrative = llm_narrative(self.llm, inv, question, versions, models)
        else:
            narrative = template_narrative(inv)
        found = {name: value for name, value in inv if name in Findings.model_fields}
        answer = Answer(
            **found, question=question, narrative=narrative, mode=self.mode,
            steps=[Step(tool=s.tool, status=str(s.status), params=s.params, error=s.error)
                   for s in inv.steps])
        answer.text = render_markdown(answer)
        answer.elapsed_s = round(time.monotonic() - started, 3)
        return answer

    def _busy(self) -> int:
        """User requests begun in the last seconds (0 unless ``when_busy`` is skip); the
        agent's own model's requests do not count."""
        if self.when_busy != "skip":
            return 0
        load = self.box.call("serving_load", seconds=BUSY_WINDOW_S,
                             exclude=getattr(self.llm, "model", None))
        return int(load.data) if load.ok else 0

    def _function_calling(self, question: str, inv: Investigation) -> Narrative:
        """llama-index's FunctionAgent over the toolbox; its final text is the narrative."""
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.core.tools import FunctionTool

        assert self.llm is not None
        tools = [FunctionTool.from_defaults(fn=_as_json(self.box, name), name=name,
                                            description=(self.box.function(name).__doc__
                                                         or name).strip())
                 for name in self.box.names]
        prompt = SYSTEM_PROMPT + (" Use the tools to find incidents, their evidence and the "
                                  "SLIs; cite incident and trace ids. Act only through "
                                  "propose_action.")
        agent = FunctionAgent(tools=tools, llm=self.llm, streaming=False, system_prompt=prompt)
        try:
            out = asyncio.run(_run(agent, self.llm, question))
        except Exception as exc:  # noqa: BLE001 - a failing model falls back to the plan
            return template_narrative(inv).model_copy(update={
                "rejected": f"function-calling agent failed: {type(exc).__name__}: {exc}"})
        text = str(out.response.content or "").strip()
        for call in out.tool_calls:
            inv.steps.append(ToolResult.model_validate_json(call.tool_output.content)
                             if call.tool_output.content.startswith("{") else ToolResult(
                                 tool=call.tool_name, status=ToolStatus.ERROR, error="no result"))
        known = {e.id for e in inv.evidence} | _ids_in_steps(inv.steps)
        cited = [i for i in known if i and i in text]
        return Narrative(text=text, source="agent", cited=cited)


async def _run(agent: Any, llm: Any, question: str) -> Any:
    try:
        return await agent.run(user_msg=question)
    finally:
        # The LLM caches an async OpenAI client whose connections belong to this event loop,
        # which ends here: close it now, or its sockets are finalised at some later garbage
        # collection (a ResourceWarning, and inside a compile CPython 3.11.7 then reports
        # "AST constructor recursion depth mismatch").
        client = getattr(llm, "_aclient", None)
        if client is not None:
            await client.close()
            llm._aclient = None


def _as_json(box: Toolbox, name: str) -> Any:
    fn = box.function(name)

    def call(**params: Any) -> str:
        return box.call(name, **params).model_dump_json()

    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    call.__name__, call.__doc__ = name, fn.__doc__
    return call


def _ids_in_steps(steps: list[ToolResult]) -> set[str]:
    text = json.dumps([s.data for s in steps], default=str)
    return set(re.findall(r"\b(?:inc|act)-[0-9a-f]{12}\b|\b[0-9a-f]{32}\b", text))


def render_markdown(a: Answer) -> str:
    """The answer as Markdown: headline, narrative, facts, evidence, actions."""
    lines: list[str] = []
    f = a.facts
    if a.intent.kind is IntentKind.LIST_INCIDENTS:
        lines.append(f"*{len(a.incidents)} incident(s) in the last {a.intent.minutes:g} "
                     "minutes*")
        lines += [f"- `{i['incident_id']}` {i['status']} {i['severity']}: {i['summary']}"
                  for i in a.incidents]
        if f is None:
            return "\n".join(lines)
        lines.append("The one that matters most:")
    if a.report is not None:
        lines += _render_report(a.report)
        return "\n".join(lines)
    if f is not None:
        where = f.component + (f"@{f.version}" if f.version else "")
        lines.append(f"*{f.fault_class or 'anomaly'} on {where}* - incident `{f.incident_id}` "
                     f"({f.status}, {f.severity})" + (f", onset {f.onset}" if f.onset else ""))
    lines.append(a.narrative.text)
    if a.evidence:
        lines.append("Evidence:")
        lines += [f"- {e.tag} {e.kind} `{e.id}`: {e.text}" for e in a.evidence]
    if a.proposal is not None:
        lines.append(proposal_text(a.proposal))
    return "\n".join(lines)


def _report_summary(r: Report) -> str:
    """The report's first line that is not a list item (its headline without one)."""
    if not r.lines:
        return "Nothing to show: " + "; ".join(r.gaps) + "."
    return next((line for line in r.lines if not line.startswith("- ")), r.headline)


def _render_report(r: Report) -> list[str]:
    lines = [f"*{r.headline}*", *r.lines]
    if r.gaps:
        lines.append("Not answered from the telemetry here: " + "; ".join(r.gaps) + ".")
    if r.queries:
        lines.append("SQL behind these figures:")
        lines += [f"```sql\n{q.sql}\n```" for q in r.queries]
    return lines


def proposal_text(p: ToolResult) -> str:
    """What happened to a proposed or decided action, in words: done, waiting for whom,
    refused and why, or impossible and why."""
    data = p.data if isinstance(p.data, dict) else {}
    what = data.get("description") or " ".join(
        str(v) for v in (p.params.get("kind"), p.params.get("model"), p.params.get("version"))
        if v) or p.params.get("action_id") or "the action"
    act = data.get("action_id")
    ref = f" ({act})" if act else ""
    status = data.get("status")
    if p.tool == "decide_action" and p.ok:
        return f"Decided: {what}{ref} is now {status}."
    if status == "denied" or p.status is ToolStatus.DENIED:
        why = data.get("decision") or p.error or "no reason given"
        return f"Not done: the policy denied {what}{ref}: {why}."
    if status == "pending" or p.status is ToolStatus.APPROVAL_REQUIRED:
        return (f"Waiting for approval: {what}{ref}; an admin can reply 'approve {act}' or "
                f"'deny {act}'.")
    if status == "dry_run":
        return (f"Dry run only: {what}{ref} was recorded in the ledger but nothing was changed "
                f"(policy mode dry_run).")
    if status in ("executed", "verified", "approved"):
        return f"Done: {what}{ref} ({status})."
    if status == "failed":
        return f"Failed: {what}{ref}: {p.error or 'see the actions list'}."
    return f"Not done: {p.error or f'{what} returned {status or p.status}'}."

"""What a chat-ops question asks: its intent and parameters.

Names that must be exact (models, versions, incident ids, time windows) are read with rules
against what the store knows: a 135M model misspells or invents them. The intent itself comes
from keywords; a question no keyword covers goes to the LLM, whose answer is held to a JSON
schema of the allowed intents and the known models (constrained generation), so it can only
choose, never invent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agents.cues import (
    BY_REPLICA,
    BY_VERSION,
    CAUSE,
    FAILED,
    NEW,
    TELEMETRY,
    VERSION,
    load_multiple,
    percentiles,
    window_minutes,
    zh_action,
)
from agents.spelling import default_speller

if TYPE_CHECKING:
    from agents.intent_knn import Guess

# Reads a question's topic from labelled examples (agents.intent_knn), given the known models.
Reader = Callable[[str, list[str]], "Guess"]

__all__ = ["TELEMETRY_KINDS", "Intent", "IntentKind", "intent_schema", "match_model",
           "parse_rules"]

DEFAULT_MINUTES = 15


class IntentKind(StrEnum):
    INVESTIGATE = "investigate"  # what happened / why slow / what is wrong
    LIST_INCIDENTS = "list_incidents"
    DESCRIBE_INCIDENT = "describe_incident"
    PROPOSE_ACTION = "propose_action"
    DECIDE_ACTION = "decide_action"  # approve or deny a pending action
    HELP = "help"
    # Questions about the telemetry itself, answered from the store (agents.questions).
    LATENCY = "latency"  # percentiles per model / version / replica
    TRACES = "traces"  # slowest or failed traces
    LOGS = "logs"  # top error logs, new log templates
    CHANGES = "changes"  # deploys, canaries, replicas, actions
    COMPARE = "compare"  # two versions side by side
    SATURATION = "saturation"  # queue depth, KV cache, replicas, memory, CPU run queue
    THROUGHPUT = "throughput"  # tokens per second
    SLO = "slo"  # objectives and error budget left
    CAPACITY = "capacity"  # would the replicas serve N x today's load, and how many it takes


TELEMETRY_KINDS = frozenset({IntentKind.LATENCY, IntentKind.TRACES, IntentKind.LOGS,
                             IntentKind.CHANGES, IntentKind.COMPARE, IntentKind.SATURATION,
                             IntentKind.THROUGHPUT, IntentKind.SLO, IntentKind.CAPACITY})


class Intent(BaseModel):
    kind: IntentKind
    model: str | None = None
    version: str | None = None
    incident_id: str | None = None
    minutes: float = Field(DEFAULT_MINUTES, gt=0, le=7 * 24 * 60)
    action: str | None = None  # rollback, scale, promote, shed_load (for propose_action)
    # A replica count the request names ("scale chat to 3 replicas"): honoured or refused.
    replicas: int | None = Field(None, ge=0, le=1000)
    action_id: str | None = None  # for decide_action
    approve: bool | None = None
    # Telemetry questions: which percentiles, broken down by what, which versions, which
    # traces (slowest or failed), only log templates new in the window.
    percentiles: list[float] = Field(default_factory=list)
    by: Literal["version", "replica"] | None = None
    versions: list[str] = Field(default_factory=list)
    order: Literal["slowest", "failed"] | None = None
    new_only: bool = False
    # Capacity questions: the multiple of today's load asked about (None: the headroom).
    load: float | None = Field(None, gt=0, le=1000)
    source: str = "rules"  # rules, examples (the nearest labelled examples) or llm


_INCIDENT_ID = re.compile(r"\binc-[0-9a-f]{6,32}\b")
# "to 3 replicas", "3 replicas", "to 3", "3 个副本", "扩到3": the number of replicas asked for.
_REPLICAS = re.compile(r"\b(\d{1,4})\s*(?:replicas?|instances?|copies)\b|\bto\s+(\d{1,4})\b(?!\s*"
                       r"(?:minutes?|mins?|hours?|h|m|s|seconds?|%|percent))|(\d{1,4})\s*个?副本"
                       r"|[扩缩]到\s*(\d{1,4})", re.I)
_DECIDE = re.compile(r"^\s*(approve|deny|reject)\s+(act-[0-9a-f]{6,32})\b", re.I)
_ACTIONS = {"rollback": "rollback", "roll back": "rollback", "revert": "rollback",
            "scale": "scale", "add a replica": "scale", "add replicas": "scale",
            "promote": "promote", "shed": "shed_load"}
_IMPERATIVE = re.compile(r"^\s*(?:please\s+|can you\s+|could you\s+)?"
                         r"(roll ?back|revert|scale|promote|shed|add (?:a )?replicas?)\b", re.I)
_LIST = re.compile(r"\b(list|any|which|show)\b.*\bincidents?\b|\bincidents?\b.*\b(open|active)\b",
                   re.I)
_INVESTIGATE = re.compile(
    r"\b(what|why|explain|happen|happened|wrong|slow|slower|errors?|failing|fail|down|"
    r"broke|broken|latency|crash|crashing|oom|issue|problem|degrad\w*|root cause)\b", re.I)
_HELP = re.compile(r"^\s*(help|\?|what can you do)", re.I)
# Words that name a model by what it does, for "the embeddings model" and the like.
_KIND_WORDS = {"embed": ("embed", "embedding", "embeddings", "minilm"),
               "ocr": ("ocr", "vision", "image", "images"),
               "chat": ("chat", "llm", "smollm", "smollm2")}
_ZH_KIND_WORDS = {"embed": ("嵌入", "向量"), "ocr": ("图像", "图片", "视觉", "文字识别", "识别"),
                  "chat": ("聊天", "对话", "大模型", "语言模型")}


def match_model(question: str, models: list[str]) -> str | None:
    """The known model the question names: its full name, a distinctive part of it
    ("smollm2"), or what it does ("the embeddings model") when only one model fits."""
    q = question.lower()
    for m in sorted(models, key=len, reverse=True):
        if m.lower() in q:
            return m
    words = set(re.findall(r"[a-z0-9]+", q))
    for m in models:
        parts = [p for p in re.split(r"[-_.]", m.lower()) if len(p) >= 4 and not p[0].isdigit()]
        if any(p in words for p in parts):
            return m
    for key, cues in _KIND_WORDS.items():
        if words & set(cues) or any(c in q for c in _ZH_KIND_WORDS[key]) \
                or _misspelt(words, cues):
            fits = [m for m in models if key in m.lower() or any(c in m.lower() for c in cues)]
            if len(fits) == 1:
                return fits[0]
    return None


def _misspelt(words: set[str], cues: tuple[str, ...]) -> bool:
    """A word of five letters or more one slip away from a cue ("embeding", "embbeding"):
    typed at 3am, still meant."""
    long_cues = [c for c in cues if len(c) >= 5]
    return any(difflib.get_close_matches(w, long_cues, n=1, cutoff=0.85)
               for w in words if len(w) >= 5)


def replica_count(question: str) -> int | None:
    """The replica count a scale request names, if any."""
    m = _REPLICAS.search(question)
    return int(next(g for g in m.groups() if g is not None)) if m else None


def parse_rules(question: str, models: list[str], reader: Reader | None = None
                ) -> Intent | None:
    """The intent by rules; None when no rule recognises the question. With ``reader``, a
    question whose topic no keyword names (and that asks no "why") takes the topic of the
    nearest labelled examples when they are sure of it, and a keyword's topic gives way to
    theirs when they are sure by a wide margin (``Guess.overrides``)."""
    question = default_speller().fix(question, models)  # "latnecy" is latency
    model = match_model(question, models)
    incident = _INCIDENT_ID.search(question)
    bare = question  # "minilm-l6-v2" names a model, not version v2
    for m in sorted(models, key=len, reverse=True):
        bare = re.sub(re.escape(m), " ", bare, flags=re.I)
    versions = list(dict.fromkeys(v.lower() for v in VERSION.findall(bare)))
    minutes = window_minutes(question) or DEFAULT_MINUTES
    common: dict[str, Any] = {"model": model, "minutes": minutes,
                              "version": versions[0] if versions else None,
                              "incident_id": incident.group(0) if incident else None}
    decide = _DECIDE.search(question)
    if decide:
        return Intent(kind=IntentKind.DECIDE_ACTION, action_id=decide.group(2),
                      approve=decide.group(1).lower() == "approve", **common)
    imperative = _IMPERATIVE.search(question)
    if imperative:
        said = imperative.group(1).lower().replace("  ", " ")
        action = next(a for k, a in _ACTIONS.items() if said.startswith(k.split()[0]))
        return Intent(kind=IntentKind.PROPOSE_ACTION, action=action,
                      replicas=replica_count(bare) if action == "scale" else None, **common)
    zh = zh_action(question)
    if zh:
        return Intent(kind=IntentKind.PROPOSE_ACTION, action=zh, **common)
    if _HELP.search(question):
        return Intent(kind=IntentKind.HELP, **common)
    if incident and not _LIST.search(question):
        return Intent(kind=IntentKind.DESCRIBE_INCIDENT, **common)
    if _LIST.search(question) and model is None:
        return Intent(kind=IntentKind.LIST_INCIDENTS, **common)
    if not CAUSE.search(question):
        telemetry = telemetry_intent(question, common, _compared(bare, versions))
        guess = reader(question, models) if reader is not None else None
        # The capacity cue is narrow (a multiple of the load, "how many replicas ... need",
        # "can it take the traffic"): no example's topic outweighs it.
        exact = telemetry is not None and telemetry.kind is IntentKind.CAPACITY
        if guess is not None and guess.sure and (telemetry is None or (
                guess.overrides and guess.kind != telemetry.kind and not exact)):
            return _from_guess(guess, question, common, _compared(bare, versions))
        if telemetry is not None:
            return telemetry
    if _INVESTIGATE.search(question) or CAUSE.search(question) or model is not None:
        return Intent(kind=IntentKind.INVESTIGATE, **common)
    return None


def _compared(bare: str, versions: list[str]) -> list[str]:
    """The versions with those named after "compare" first ("rolled out v2, compare v1 and
    v2" compares v1 with v2), as the comparison names them."""
    cue = dict(TELEMETRY)["compare"].search(bare)
    if cue is None:
        return versions
    after = list(dict.fromkeys(v.lower() for v in VERSION.findall(bare[cue.end():])))
    if len(after) < 2:
        return versions
    return after + [v for v in versions if v not in after]


def _from_guess(guess: Guess, question: str, common: dict[str, Any], versions: list[str]
                ) -> Intent:
    """The intent the nearest examples read, with the slots the rules read."""
    kind = IntentKind(guess.kind)
    if kind in TELEMETRY_KINDS:
        intent = telemetry_intent(question, common, versions, kind)
        assert intent is not None
        update: dict[str, Any] = {"source": "examples"}
        if kind is IntentKind.TRACES and guess.slot is not None:
            update["order"] = guess.slot  # failed or slowest
        if kind is IntentKind.LOGS:
            update["new_only"] = guess.slot == "new"
        return intent.model_copy(update=update)
    return Intent(kind=kind, source="examples", **common)


def telemetry_intent(question: str, common: dict[str, Any], versions: list[str],
                     kind: IntentKind | None = None) -> Intent | None:
    """A question that asks for a figure from the telemetry (not why something happened);
    ``kind`` when something else (the nearest examples) read the topic."""
    # "p95 by replica" asks for latency: a breakdown does not name the topic.
    topic = BY_REPLICA.sub(" ", question)
    if kind is None:
        kind = next((IntentKind(k) for k, cue in TELEMETRY if cue.search(topic)), None)
    if kind is None:
        return None
    by: str | None = None
    if BY_REPLICA.search(question):
        by = "replica"
    elif BY_VERSION.search(question) and len(versions) != 1:
        by = "version"  # "per version"; a question naming one version filters on it instead
    extra: dict[str, Any] = {"by": by, "versions": versions, "percentiles": percentiles(question)}
    if kind is IntentKind.TRACES:
        extra["order"] = "failed" if FAILED.search(question) else "slowest"
    if kind is IntentKind.LOGS:
        extra["new_only"] = bool(NEW.search(question))
    if kind is IntentKind.CAPACITY:
        extra["load"] = load_multiple(question)
    if kind is IntentKind.COMPARE:
        common = {**common, "version": None}  # both versions are in ``versions``
    return Intent(kind=kind, **common, **extra)


def intent_schema(models: list[str]) -> dict[str, Any]:
    """The JSON schema an LLM's reading of a question must match: it picks, it cannot
    invent (unknown models are impossible to generate)."""
    return {"type": "object", "properties": {
        "intent": {"enum": [k.value for k in IntentKind]},
        "model": {"enum": [*models, "none"]},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 10080}},
        "required": ["intent", "model", "minutes"]}

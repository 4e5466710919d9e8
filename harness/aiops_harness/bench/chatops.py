"""`aiops bench chatops`: what the agent's LLM calls cost the traffic being served.

The embedded stack with the default chat model (its spec from serve/models.yaml) and the
agent's own replica (``aiops-agent``, the same weights). Two clients send chat requests back to
back while, in turn:

- ``none``: nothing else runs;
- ``shared``: the agent writes incident narratives on the users' own chat model (what it did
  before it had a replica of its own);
- ``own``: the agent writes the same narratives on ``aiops-agent`` (the default now).

Each narrative is the real call the agent makes (``agents.narrate.llm_narrative``) for an
investigation of an eval fixture. Reported per phase: the users' p50/p95 latency, how many
narratives were written and how long one took.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from aiops.config import Settings
from aiops_harness.bench.common import free_port, percentile

__all__ = ["ChatopsResult", "Phase", "run_chatops"]

CHAT, AGENT = "smollm2-135m-instruct", "aiops-agent"
PHASES = ("none", "shared", "own")
PROMPTS = ["Name three colours.", "What is a load balancer?", "Say hello politely.",
           "Give one tip for sleeping well."]


@dataclass
class Phase:
    name: str
    user_ms: list[float] = field(default_factory=list)
    user_errors: int = 0
    narratives: int = 0
    narrative_s: list[float] = field(default_factory=list)

    @property
    def p50_ms(self) -> float:
        return percentile(self.user_ms, 50) if self.user_ms else float("nan")

    @property
    def p95_ms(self) -> float:
        return percentile(self.user_ms, 95) if self.user_ms else float("nan")

    @property
    def narrative_mean_s(self) -> float:
        return statistics.mean(self.narrative_s) if self.narrative_s else float("nan")


@dataclass
class ChatopsResult:
    phase_s: float
    rounds: int
    phases: list[Phase] = field(default_factory=list)  # one per mode, rounds pooled


def _specs() -> list[dict[str, Any]]:
    from serve.specs import DEFAULT_SPECS_FILE, load_specs

    return [s.model_dump(mode="json", exclude_none=True) for s in load_specs(DEFAULT_SPECS_FILE)
            if s.name in (CHAT, AGENT)]


def _users(url: str, stop: threading.Event, phase: list[Phase], clients: int = 2
           ) -> list[threading.Thread]:
    def run(k: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            n = k
            while not stop.is_set():
                n += clients
                started = time.perf_counter()
                r = c.post("/v1/chat/completions", json={
                    "model": CHAT, "max_tokens": 32, "temperature": 0.0,
                    "messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}]})
                ms = (time.perf_counter() - started) * 1000
                current = phase[0]
                if r.status_code == 200:
                    current.user_ms.append(ms)
                else:
                    current.user_errors += 1

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    return threads


def _investigation() -> tuple[Any, str, list[str], list[str]]:
    """An incident investigation from an eval fixture, as the agent would narrate it."""
    from agents.agent import Agent
    from agents.intent import parse_rules
    from agents.investigate import investigate
    from agents.tools import Toolbox
    from aiops.store import Store
    from aiops_harness.agent_evals.cases import load_cases, load_telemetry
    from aiops_harness.agent_evals.replay import replay

    case = load_cases(only="canary-smollm2-v2-slow")[0]
    store = Store(None)
    try:
        load_telemetry(case, store)
        replay(case, store)
        now = case.now_ns
        box = Toolbox(store, now=lambda: now)
        agent = Agent(box)
        models, versions = agent.known_models(), agent.known_versions()
        intent = parse_rules(case.question, models)
        assert intent is not None
        return investigate(box, intent), case.question, versions, models
    finally:
        store.close()


def run_chatops(phase_s: float = 30.0, rounds: int = 3) -> ChatopsResult:
    from agents.agent import make_llm
    from agents.narrate import llm_narrative
    from aiops import stack

    inv, question, versions, models = _investigation()
    result = ChatopsResult(phase_s, rounds)
    with tempfile.TemporaryDirectory(prefix="aiops-bench-chatops-") as tmp:
        models_file = Path(tmp) / "models.yaml"
        models_file.write_text(yaml.safe_dump({"models": _specs()}))
        settings = Settings(
            data_dir=Path(tmp) / "stack", server_port=free_port(), serve_port=free_port(),
            control_port=free_port(), ray_metrics_port=free_port(), models_file=models_file,
            ebpf="off", log_level="WARNING")
        stack.up(settings)
        stop = threading.Event()
        current = [Phase("warm-up")]
        users = _users(settings.serve_url, stop, current)
        try:
            time.sleep(15)  # both replicas warm, autoscaling settled
            # The modes take turns, round after round, so the machine's drift hits all alike.
            pooled = {name: Phase(name) for name in PHASES}
            for _ in range(rounds):
                for name in PHASES:
                    phase = pooled[name]
                    current[0] = phase
                    llm = None if name == "none" else make_llm(
                        f"{settings.serve_url}/v1", CHAT if name == "shared" else AGENT,
                        priority="" if name == "shared" else "batch")
                    deadline = time.monotonic() + phase_s
                    while time.monotonic() < deadline:
                        if llm is None:
                            time.sleep(0.5)
                            continue
                        started = time.perf_counter()
                        llm_narrative(llm, inv, question, versions, models)
                        phase.narrative_s.append(time.perf_counter() - started)
                        phase.narratives += 1
            result.phases = list(pooled.values())
        finally:
            stop.set()
            for t in users:
                t.join(timeout=130)
            stack.down(settings)
    return result

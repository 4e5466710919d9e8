"""`aiops demo`: the embedded stack under mixed traffic, a real incident, and the loop closing
on it: detection -> incident -> root cause -> action under policy -> verification -> the
chat-ops answer -> a report with the SLIs and the action annotations.

Everything it starts it stops, on success, failure or Ctrl-C (``finally: down``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from aiops.client import ServerClient
from aiops.config import Settings
from aiops.errors import AIOpsError, StackError
from aiops.lifecycle import LifecycleClient, admin_token
from aiops.remediation.policy import DEMO_POLICY
from aiops_harness.demo.report import write_report
from aiops_harness.demo.scenarios import SCENARIOS, Scenario
from aiops_harness.demo.traffic import DEFAULT_WORKLOADS, Traffic, Workload
from serve.cluster import lose_node

__all__ = ["ScenarioResult", "demo_settings", "run_demo"]

# Long enough for the detectors to have a normal to compare with (the tail tests want 30+
# spans of a model's history) on a stack that has only just started.
BASELINE_S = 45.0
DETECT_TIMEOUT_S = 120.0
RECOVER_TIMEOUT_S = 150.0
DECIDING = ("proposed", "approved")  # on the way to executed (or failed)


@dataclass
class ScenarioResult:
    scenario: Scenario
    fault_at: float
    model: str = ""  # the model version at fault: the scenario's, or the lost node's replica's
    version: str = ""
    events: list[tuple[float, str]] = field(default_factory=list)
    incident: dict[str, Any] | None = None
    detected_at: float | None = None
    action: dict[str, Any] | None = None
    acted_at: float | None = None
    verified_at: float | None = None
    fixed_at: float | None = None  # the demo's operator removed the fault
    resolved_at: float | None = None
    recovered_at: float | None = None  # the clients' last bad request
    answer: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def mttd_s(self) -> float | None:
        return self.detected_at - self.fault_at if self.detected_at else None

    @property
    def ttr_s(self) -> float | None:
        return self.recovered_at - self.fault_at if self.recovered_at else None

    def __post_init__(self) -> None:
        self.model = self.model or self.scenario.model
        self.version = self.version or self.scenario.version

    @property
    def attributed(self) -> bool:
        inc = self.incident or {}
        s = self.scenario
        if s.lose_node:
            top = (inc.get("evidence") or {}).get("root_causes") or [{}]
            if top[0].get("node") != s.lose_node:
                return False
        return inc.get("service") == self.model and inc.get("model_version") == self.version \
            and inc.get("fault_class") in s.expect_fault

    def note(self, text: str, at: float | None = None) -> None:
        self.events.append((at or time.time(), text))


def demo_settings(base: Settings, **overrides: Any) -> Settings:
    """The demo's stack: the packaged models, the demo policy (rollbacks on their own), in
    its own data directory. Detection runs at the default settings (what `aiops up` runs);
    only resolving is quicker, so that one scenario's incident closes before the next."""
    values = base.model_dump()
    values.update(data_dir=base.data_dir / "demo", models_file=None, policy_file=DEMO_POLICY,
                  analytics=True, analytics_resolve_after_s=10.0,
                  # Logical CPUs for Ray's scheduler: the chat model autoscales to two
                  # replicas under the demo's load, and its v2 canary needs room beside them.
                  ray_num_cpus=max(base.ray_num_cpus, 4))
    values.update(overrides)
    return Settings(**values)


def _iso(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()


class _Screen:
    """The live view: traffic per kind, the phase and the story so far."""

    def __init__(self, console: Console, traffic: Traffic, headless: bool) -> None:
        self.console, self.traffic, self.headless = console, traffic, headless
        self.phase = "starting"
        self.lines: list[str] = []
        self.live: Live | None = None

    def __enter__(self) -> _Screen:
        if not self.headless:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(None, None, None)

    def say(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.lines.append(f"[dim]{stamp}[/dim] {text}")
        if self.live is None:
            self.console.print(f"[dim]{stamp}[/dim] {text}")
        self.refresh()

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def _render(self) -> Group:
        t = Table("traffic (last 10 s)", "model", "req/s", "p50 ms", "p95 ms", "failed",
                  "versions", title=f"phase: {self.phase}")
        window = self.traffic.window(10)
        for kind in ("chat", "stream", "embed", "image"):
            xs = [s for s in window if s.kind == kind]
            lat = sorted(s.seconds * 1000 for s in xs)
            failed = sum(s.status != 200 for s in xs)
            versions = ", ".join(sorted({s.version for s in xs if s.version}))
            t.add_row(kind, xs[0].model if xs else "", f"{len(xs) / 10:.1f}",
                      _quantile(lat, 0.5), _quantile(lat, 0.95), str(failed), versions)
        return Group(t, *self.lines[-14:])


def _quantile(sorted_ms: list[float], q: float) -> str:
    if not sorted_ms:
        return "-"
    return f"{sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]:.0f}"


def _wait(what: str, timeout_s: float, probe: Callable[[], Any], screen: _Screen) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        screen.refresh()
        time.sleep(0.5)
    raise StackError(f"demo: {what} did not happen within {timeout_s:.0f} s")


def _specs_with_canary(control: LifecycleClient, model: str) -> list[dict[str, Any]]:
    from serve.specs import DEFAULT_SPECS_FILE, load_specs

    specs = [s.model_dump(mode="json") for s in load_specs(DEFAULT_SPECS_FILE)]
    base = next(s for s in specs if s["name"] == model)
    base["traffic"] = 100
    return [*specs, {**base, "version": "v2", "traffic": 0}]


def _replica_on(data_dir: Path, node: str, preferred: list[str]) -> tuple[str, str]:
    """A model version with a replica on ``node``, from the driver's replica list: the
    first of ``preferred`` (the models the clients call, in the traffic's order) there,
    else any (the agent's own, which no client calls)."""
    import json

    from aiops.datadir import REPLICAS_FILE

    try:
        rows = json.loads((data_dir / REPLICAS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise StackError(f"demo: no replica list in {data_dir} ({exc})") from exc
    there = sorted({(r["model"], r["version"]) for r in rows
                    if r.get("node") == node and r.get("model")},
                   key=lambda mv: (preferred.index(mv[0]) if mv[0] in preferred
                                   else len(preferred), mv))
    if not there:
        raise StackError(f"demo: no model replica runs on Ray node {node}; Serve placed "
                         "them all elsewhere")
    return there[0]


def _run_scenario(s: Scenario, settings: Settings, traffic: Traffic, screen: _Screen,
                  db: ServerClient, control: LifecycleClient) -> ScenarioResult:
    screen.phase = f"{s.name}: {s.title}"
    if s.lose_node:
        model, version = _replica_on(settings.data_dir, s.lose_node,
                                     [w.model for w in traffic.workloads])
        result = ScenarioResult(s, time.time(), model, version)
        node = lose_node(settings.data_dir, s.lose_node)
        screen.say(f"[bold]node lost[/bold]: killed Ray node {s.lose_node}'s raylet (pid "
                   f"{node.raylet_pid}) and its processes; it ran a replica of "
                   f"{model}@{version}")
    elif s.canary_percent is not None:
        screen.say(f"deploying {s.model} v2 (unrouted; gates run on it first)")
        control.apply(_specs_with_canary(control, s.model))
        control.set_faults(s.model, "v2", s.faults)
        result = ScenarioResult(s, time.time())
        control.canary(s.model, "v2", s.canary_percent)
        screen.say(f"[bold]canary[/bold]: {s.model} v2 takes {s.canary_percent}% of traffic "
                   f"(it carries an injected fault: {s.faults})")
    else:
        control.set_faults(s.model, "v1", s.faults)
        result = ScenarioResult(s, time.time())
        screen.say(f"[bold]fault[/bold] on {s.model} v1: {s.faults}")
    result.note("fault injected", result.fault_at)

    def incident() -> dict[str, Any] | None:
        # The first incident row after the fault that attributes it to this model version
        # (a new incident, or one already open whose verdict changed to it).
        rows = db.rows("SELECT incident_id, epoch_ns(min(updated_at)) / 1e9 AS t "
                       "FROM incidents WHERE service = ? AND model_version = ? "
                       "AND epoch_ns(updated_at) >= ? AND status <> 'resolved' "
                       "GROUP BY incident_id ORDER BY t LIMIT 1",
                       [result.model, result.version, int(result.fault_at * 1e9)])
        return rows[0] if rows else None

    found = _wait(f"an incident on {result.model}", DETECT_TIMEOUT_S, incident, screen)
    inc = db.incident(found["incident_id"])
    result.detected_at = float(found["t"])
    result.note("incident opened", result.detected_at)
    screen.say(f"[red]detected[/red] after {result.mttd_s:.1f} s: incident "
               f"{inc['incident_id']} ({inc['severity']})")
    result.incident = inc
    causes = inc["evidence"].get("root_causes", [])
    if causes:
        top = causes[0]
        ids = ", ".join(f"{e['kind']} {e['id']}" for e in top["evidence"][:3])
        screen.say(f"root cause: [bold]{top['fault_class']}[/bold] on [bold]{top['entity']}"
                   f"[/bold] (confidence {top['confidence']:.0%}); evidence: {ids}")

    def action() -> dict[str, Any] | None:
        # The decision about the diagnosed version (an incident already open on the model
        # may carry an earlier action about another version, e.g. a scale-out of v1).
        for a in db.actions():
            if a["incident_id"] == inc["incident_id"] and a["status"] not in DECIDING \
                    and a["target"] == f"{result.model}@{result.version}" \
                    and (_iso(a["created_at"]) or 0) >= result.fault_at - 1:
                return a
        return None

    try:
        act = _wait("a decision on an action", 15, action, screen)
    except StackError:
        act = None
    if act is not None:
        result.action = act
        screen.say(f"action [bold]{act['kind']} {act['target']}[/bold]: policy mode "
                   f"{act['mode']} -> {act['status']}")
    if act is not None and act["status"] in ("executed", "verified"):
        rows = db.rows("SELECT epoch_ns(updated_at) / 1e9 AS t FROM actions WHERE "
                       "action_id = ? AND status = 'executed'", [act["action_id"]])
        result.acted_at = float(rows[0]["t"]) if rows else time.time()
        result.note(f"{act['kind']} executed", result.acted_at)
        screen.say(f"[green]executed[/green] {act['kind']} {act['target']} "
                   f"{result.acted_at - result.fault_at:.1f} s after the fault")
    elif s.operator_fix_after_s is not None and s.faults:
        # The operator's fix comes that long after detection, however long the wait for a
        # decision was (with no action planned, it is the whole 15 s).
        time.sleep(max(0.0, result.detected_at + s.operator_fix_after_s - time.time()))
        control.set_faults(result.model, result.version, {})
        result.fixed_at = time.time()
        result.note("operator removed the fault", result.fixed_at)
        screen.say("no automatic action for this one: the operator removes the fault")
    # The verdict as it stands when the fault is acted on (the action executed, or the
    # operator's fix): evidence that names the cause (run-queue waits, memory growth) may come
    # a round or two after the first symptom, as it would for an on-call engineer.
    current = db.incident(inc["incident_id"])
    if (current.get("service"), current.get("model_version")) == (result.model,
                                                                   result.version):
        if current.get("fault_class") != inc.get("fault_class"):
            screen.say(f"verdict now: [bold]{current.get('fault_class')}[/bold] on "
                       f"{current.get('service')}@{current.get('model_version')}")
        result.incident = inc = current

    def resolved() -> dict[str, Any] | None:
        current = db.incident(inc["incident_id"])
        return current if current["status"] == "resolved" else None

    try:
        done = _wait("the incident to resolve", RECOVER_TIMEOUT_S, resolved, screen)
        result.resolved_at = _iso(done["closed_at"])
        result.note("incident resolved", result.resolved_at)
        # Recovered: the later of the fix and the clients' last bad request.
        result.recovered_at = max(t for t in (
            traffic.last_bad_after(result.fault_at, result.model, s.slo_s), result.acted_at,
            result.fixed_at, result.fault_at) if t is not None)
        screen.say(f"[green]recovered[/green]: the clients' last bad request "
                   f"{(result.ttr_s or 0):.1f} s after the fault; incident resolved")
    except StackError as exc:
        result.problems.append(str(exc))
        screen.say(f"[red]{exc}[/red]")
    if result.action is not None:
        final = next((a for a in db.actions() if a["action_id"] == result.action["action_id"]),
                     result.action)
        result.action = final
        if final["status"] == "verified":
            result.verified_at = time.time()
            screen.say(f"action {final['action_id']} [green]verified[/green] (SLIs recovered)")
    if s.faults:
        control.set_faults(result.model, result.version, {})
    return result


def _settle(db: ServerClient, screen: _Screen, timeout_s: float = 60.0) -> None:
    """Wait until no incident is active (start-up noise resolved), so the next one is the
    scenario's."""
    try:
        _wait("a quiet moment (no active incident)", timeout_s,
              lambda: not db.incidents("active"), screen)
    except StackError:
        active = ", ".join(f"{i['incident_id']} ({i['summary']})" for i in db.incidents("active"))
        screen.say(f"[yellow]still active, going on: {active}[/yellow]")


def _ask(settings: Settings, db: ServerClient, model: str, screen: _Screen
         ) -> dict[str, Any] | None:
    question = f"What happened to {model} in the last 15 minutes?"
    screen.say(f"chat-ops: [italic]{question}[/italic]")
    try:
        return db.ask(question, "demo", admin_token(settings))
    except AIOpsError as exc:
        screen.say(f"[red]the agent did not answer: {exc}[/red]")
        return None


def run_demo(settings: Settings, console: Console, scenarios: list[str],
             report_dir: Path = Path("reports"), headless: bool = False,
             workloads: tuple[Workload, ...] = DEFAULT_WORKLOADS) -> list[ScenarioResult]:
    """Bring the demo stack up, run the scenarios under ``workloads``' traffic, write the
    report, bring it all down."""
    from aiops.stack import down, up

    unknown = [n for n in scenarios if n not in SCENARIOS]
    if unknown:
        raise StackError(f"unknown scenario(s) {', '.join(unknown)}: "
                         f"{', '.join(SCENARIOS)} or all")
    nodes = max(SCENARIOS[n].worker_nodes for n in scenarios) if scenarios else 0
    if nodes > settings.ray_worker_nodes:
        settings = settings.model_copy(update={"ray_worker_nodes": nodes})
    results: list[ScenarioResult] = []
    started = time.time()
    if settings.data_dir.name == "demo" and settings.data_dir.is_dir():
        shutil.rmtree(settings.data_dir)  # the demo's own: every run starts from nothing
    up(settings, progress=console.log)
    traffic = None
    try:
        traffic = Traffic(settings.serve_url, workloads, api_key=next(
            (k.strip() for k in settings.api_keys.split(",") if k.strip()), None)).start()
        with _Screen(console, traffic, headless) as screen, \
                ServerClient.of(settings) as db, \
                LifecycleClient.from_settings(settings) as control:
            screen.phase = "baseline"
            screen.say(f"mixed traffic (chat, streaming chat, embeddings, images); "
                       f"{BASELINE_S:.0f} s of baseline")
            deadline = time.monotonic() + BASELINE_S
            while time.monotonic() < deadline:
                screen.refresh()
                time.sleep(0.5)
            _settle(db, screen)
            for i, name in enumerate(scenarios):
                if i:
                    _settle(db, screen)
                result = _run_scenario(SCENARIOS[name], settings, traffic, screen, db, control)
                result.answer = _ask(settings, db, result.model, screen)
                results.append(result)
            screen.phase = "done"
        for r in results:
            if r.answer is not None:
                from agents.cli import render

                console.rule(f"chat-ops: what happened to {r.model}? "
                             f"({r.scenario.name})")
                render(r.answer, console)
        paths = write_report(results, traffic, report_dir, started)
        _summary(console, results)
        console.print(f"report: {paths[0]}")
    finally:
        if traffic is not None:
            traffic.close()
        down(settings, progress=console.log)
    return results


def _summary(console: Console, results: list[ScenarioResult]) -> None:
    t = Table("scenario", "attributed", "action", "MTTD s", "time to recovered s",
              title="incidents")
    for r in results:
        inc = r.incident or {}
        who = f"{inc.get('fault_class')} on {inc.get('service')}@{inc.get('model_version')}"
        act = f"{r.action['kind']} ({r.action['status']})" if r.action else \
            ("operator fix" if r.fixed_at else "-")
        t.add_row(r.scenario.name, ("[green]" if r.attributed else "[red]") + who, act,
                  f"{r.mttd_s:.1f}" if r.mttd_s is not None else "-",
                  f"{r.ttr_s:.1f}" if r.ttr_s is not None else "-")
    console.print(t)

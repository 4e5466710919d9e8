"""The incident tracker owns incidents: the analyzer's rounds, actions marking incidents
mitigating (from a request's thread) and readers of what is open all go through one lock, and
what it hands out are snapshots. Without that, a reader iterating the open incidents during a
round fails ("dictionary changed size during iteration"), or an action's mark lands on an
incident the round just resolved."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from aiops.analytics.findings import Entity, FaultClass, Finding
from aiops.analytics.incidents import Incident, IncidentTracker, Status
from aiops.store import Store

NS = 1_000_000_000
SERVICES = [f"m{i}" for i in range(12)]
ROUNDS = 400


@pytest.fixture(autouse=True)
def switch_often() -> Iterator[None]:
    """Threads switch every few microseconds, so that the races show in a short run."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _round(k: int) -> list[Finding]:
    """A third of the services stop firing each round (their incidents resolve), a third
    start again (new incidents), and each incident gains a finding every round."""
    return [Finding(f"d{(k + j) % 7}", Entity(s, "v1"), FaultClass.LATENCY, 1.0 + j, k * NS,
                    (k + 1) * NS, f"slow {s}", change=f"{s}@v1 released")
            for j, s in enumerate(SERVICES) if (j + k) % 3]


def _race(tracker: IncidentTracker, now: list[int], readers: list[Callable[[], None]],
          rounds: int = ROUNDS) -> tuple[list[BaseException], list[Incident]]:
    """The analyzer's rounds in one thread, each reader looping in its own, until the rounds
    end or a thread fails. Returns what failed, and what each round said it resolved."""
    stop = threading.Event()
    errors: list[BaseException] = []
    resolved: list[Incident] = []

    def analyze() -> None:
        try:
            for k in range(1, rounds):
                if stop.is_set():
                    return
                now[0] = k * NS
                resolved.extend(i for i in tracker.update(_round(k), k * NS)
                                if i.status is Status.RESOLVED)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            stop.set()

    def loop(read: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    read()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop.set()
        return run

    threads = [threading.Thread(target=analyze),
               *(threading.Thread(target=loop(r)) for r in readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors, resolved


def test_actions_and_readers_never_race_the_analyzer_round() -> None:
    tracker = IncidentTracker(resolve_after_s=1.0, refresh_s=0.0)
    now = [0]

    def read_open() -> None:  # the server: which versions are troubled, what is open
        for inc in tracker.open.values():
            assert inc.summary and inc.row()["incident_id"] == inc.incident_id
            assert sum(1 for _ in inc.findings.values()) == len(inc.findings)

    def act() -> None:  # an approval's request thread: the action ran, mark it mitigating
        for inc in list(tracker.open.values()):
            tracker.mark_mitigating(inc.incident_id, now[0])

    errors, resolved = _race(tracker, now, [read_open, read_open, act])
    assert not errors, f"{len(errors)} thread(s) failed, first: {errors[0]!r}"
    assert resolved, "the rounds resolved nothing: no race was run"
    # What a round resolved stays resolved: a mark landing after it would undo that.
    undone = [i.incident_id for i in resolved if i.status is not Status.RESOLVED]
    assert not undone, f"{len(undone)} resolved incident(s) were marked mitigating after"


def test_the_latest_row_of_each_incident_is_its_state_whatever_the_interleaving(
        store: Store) -> None:
    tracker = IncidentTracker(resolve_after_s=1.0, refresh_s=0.0, store=store)
    now = [0]

    def act() -> None:
        # The action's clock runs ahead of the round that is folding: the round's rows must
        # still come after the mitigating row, or the latest row would be a stale state.
        for inc in list(tracker.open.values()):
            tracker.mark_mitigating(inc.incident_id, now[0] + 2 * NS)

    errors, resolved = _race(tracker, now, [act], rounds=60)
    assert not errors, f"{len(errors)} thread(s) failed, first: {errors[0]!r}"
    current = dict(store.query("SELECT incident_id, status FROM incidents_current").rows)
    still_open = {i.incident_id: str(i.status) for i in tracker.open.values()}
    assert resolved and {i.incident_id for i in resolved} <= set(current)
    assert {i: s for i, s in current.items() if i not in still_open} == {
        i: "resolved" for i in current if i not in still_open}
    assert {i: current[i] for i in still_open} == still_open
    assert "mitigating" in {r[0] for r in store.query("SELECT status FROM incidents").rows}


def test_readers_get_snapshots_and_listeners_hear_every_round() -> None:
    tracker = IncidentTracker(resolve_after_s=30)
    heard: list[tuple[list[str], int]] = []
    tracker.subscribe(lambda changed, now_ns: heard.append(
        ([i.incident_id for i in changed], now_ns)))
    (inc,) = tracker.update(_round(1)[:1], NS)
    inc.status = Status.RESOLVED  # a reader's copy: the tracker's own is untouched
    tracker.open[inc.service].findings.clear()
    assert tracker.open[inc.service].status is Status.OPEN
    assert tracker.open[inc.service].findings
    tracker.update([], 2 * NS)
    assert heard == [([inc.incident_id], NS), ([], 2 * NS)]
    assert tracker.open_ids() == {inc.incident_id}


def test_a_listener_may_call_back_into_the_tracker() -> None:
    """Listeners are called outside the lock: remediation, holding its own lock, marks
    incidents mitigating from there while a request's thread does the same."""
    tracker = IncidentTracker()
    lock = threading.Lock()
    marked: list[Incident | None] = []

    def on_round(changed: list[Incident], now_ns: int) -> None:
        with lock:
            for inc in changed:
                marked.append(tracker.mark_mitigating(inc.incident_id, now_ns))

    tracker.subscribe(on_round)
    t = threading.Thread(target=tracker.update, args=(_round(1), NS))
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and marked and all(
        m is not None and m.status is Status.MITIGATING for m in marked)

"""The agent's incident fixtures: they load, cover every scenario family, are generated
deterministically, and the real live analyzer, replayed over each, finds what the case says.
"""

from __future__ import annotations

import gzip
import itertools
import json
import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aiops.store import Store
from aiops_harness.agent_evals import generate
from aiops_harness.agent_evals.cases import (
    CASES_DIR,
    TELEMETRY_TABLES,
    Case,
    load_cases,
    load_telemetry,
)
from aiops_harness.agent_evals.replay import (
    FINDING,
    IncidentSummary,
    expected_incident,
    replay,
    replay_case,
    round_times,
    summarize_incidents,
)

NS = 1_000_000_000
CASES = load_cases()
FAMILIES = {"canary": 3, "errors": 3, "crash": 3, "cpu": 3, "memory": 3, "queue": 3,
            "invalid-input": 3, "slow-tokens": 3, "config": 3, "network": 3, "healthy": 2,
            "noise": 3, "injection": 2}


def _rows(case: Case, table: str) -> list[dict[str, object]]:
    path = case.folder / f"{table}.jsonl.gz"
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_there_are_enough_cases_and_each_loads_and_validates() -> None:
    assert len(CASES) >= 32
    for case in CASES:
        e = case.expect
        if e.component is None:
            assert e.version is None and e.fault_class is None and e.onset is None, case.name
        else:
            assert e.fault_class is not None and case.onset_ns is not None, case.name
            assert case.now_ns - 600 * NS < case.onset_ns < case.now_ns, case.name
        assert case.objectives and case.question.strip() and case.description.strip()
        store = Store(None)
        try:
            counts = load_telemetry(case, store)
            assert counts.get("spans", 0) > 100 and counts.get("logs", 0) > 100, case.name
            latest = store.query("SELECT max(epoch_ns(end_time)) FROM spans").rows[0][0]
            assert latest <= case.now_ns, f"{case.name}: telemetry after the question"
            # The expected facts are there to be found: the component serves (or refuses),
            # the version answered, the replica exists.
            if e.component is not None:
                versions = {r[0] for r in store.query(
                    "SELECT DISTINCT (attributes->>'aiops.model.version') FROM spans "
                    "WHERE service_name = ?", [e.component]).rows}
                assert versions and (e.version is None or e.version in versions), case.name
            if e.replica is not None:
                assert store.query(
                    "SELECT count(*) FROM spans WHERE (resource_attributes->>'ray.serve.replica') "
                    "= ?", [e.replica]).rows[0][0] > 0, case.name
            assert set(case.objectives) <= {r[0] for r in store.query(
                "SELECT DISTINCT service_name FROM spans").rows}, case.name
        finally:
            store.close()


def test_the_tags_cover_every_scenario_family() -> None:
    tags = Counter(t for case in CASES for t in case.tags)
    short = {f: tags[f] for f, need in FAMILIES.items() if tags[f] < need}
    assert not short, f"families with too few cases: {short}"


def test_cases_stay_small() -> None:
    for case in CASES:
        size = sum(p.stat().st_size for p in case.folder.iterdir())
        assert size < 160 * 1024, f"{case.name}: {size} bytes"


def test_injection_cases_carry_instructions_in_their_telemetry() -> None:
    for case in (c for c in CASES if "injection" in c.tags):
        text = json.dumps([_rows(case, t) for t in TELEMETRY_TABLES]).lower()
        assert "ignore previous instructions" in text or "propose_action" in text, case.name


def test_generation_is_deterministic_and_matches_the_committed_cases(tmp_path: Path) -> None:
    generate.main(["--out", str(tmp_path)])
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(CASES_DIR) for p in CASES_DIR.rglob("*") if p.is_file())
    assert made == committed
    stale = [str(p) for p in made if (tmp_path / p).read_bytes() != (CASES_DIR / p).read_bytes()]
    assert not stale, f"rerun `python -m aiops_harness.agent_evals.generate`: {stale}"


def test_rounds_run_every_step_from_a_minute_in_up_to_now() -> None:
    times = round_times(0, 100 * NS, 5.0)
    assert times[0] == 60 * NS and times[-1] == 100 * NS
    assert all(b - a == 5 * NS for a, b in itertools.pairwise(times[:-1]))
    assert round_times(None, 7, 5.0) == [7]


# -- replaying the live analyzer ------------------------------------------------------------------

# The goal the issue sets: the live analyzer states the expected facts for >= 90% of cases
# (healthy cases count as right when they raise no incident).
PASS_RATE = 0.9


@pytest.fixture(scope="module")
def replayed() -> dict[str, list[IncidentSummary]]:
    """Every case replayed once (in parallel, one process per core)."""
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip([c.name for c in CASES], pool.map(replay_case, CASES), strict=True))


def _verdict(case: Case, incidents: list[IncidentSummary]) -> str | None:
    """None when the replay states the case's facts, else what it said instead."""
    e = case.expect
    if e.component is None:  # no page; what is held (not a page) may be there
        pages = [i for i in incidents if i.status != FINDING]
        return None if not pages else f"expected no incident, got {len(pages)}"
    if expected_incident(case, incidents) is not None:
        return None
    got = [f"{i.cause_service}@{i.cause_version}/{i.cause_replica} {i.fault_class} onset "
           f"{(i.onset_ns - case.now_ns) / NS:+.0f}s" for i in incidents]
    return (f"expected {e.component}@{e.version}/{e.replica} {e.fault_class} onset "
            f"{((case.onset_ns or 0) - case.now_ns) / NS:+.0f}s; got {got}")


def test_the_replay_appends_incidents_beside_the_telemetry() -> None:
    full = next(c for c in CASES if c.name == "errors-smollm2-v1-backend")
    assert full.onset_ns is not None
    # Asked 45 s after the onset: only what had arrived by then counts.
    case = full.model_copy(update={"now": datetime.fromtimestamp(
        (full.onset_ns + 45 * NS) / NS, UTC)})
    store = Store(None)
    try:
        load_telemetry(case, store)
        analyzer = replay(case, store)
        earliest = store.query("SELECT min(epoch_ns(start_time)) FROM spans").rows[0][0]
        assert analyzer.store is store
        assert analyzer.stats.rounds == len(round_times(earliest, case.now_ns))
        incidents = summarize_incidents(store)
        assert expected_incident(case, incidents) is not None
        assert all(i.opened_ns <= case.now_ns for i in incidents)
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_the_analyzer_states_the_expected_facts(
        name: str, replayed: dict[str, list[IncidentSummary]]) -> None:
    case = next(c for c in CASES if c.name == name)
    problem = _verdict(case, replayed[name])
    assert problem is None, problem


@pytest.mark.slow
def test_the_analyzer_gets_most_cases_right(
        replayed: dict[str, list[IncidentSummary]]) -> None:
    missed = {c.name: p for c in CASES if (p := _verdict(c, replayed[c.name])) is not None}
    assert all(c.expect.component is not None for c in CASES if c.name in missed), missed
    assert 1 - len(missed) / len(CASES) >= PASS_RATE, missed


def test_a_sample_takes_one_case_of_each_family_first() -> None:
    from aiops_harness.agent_evals.cli import spread

    families = {c.tags[0] for c in CASES}
    picked = spread(CASES, len(families))
    assert {c.tags[0] for c in picked} == families
    assert picked == sorted(picked, key=CASES.index)  # in fixture order
    assert len(spread(CASES, 1000)) == len(CASES) and spread(CASES, 1) == [CASES[0]]

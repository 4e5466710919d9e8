"""Incident memory: resolved incidents are embedded with the stack's embedding model, kept in
a DuckDB vector store behind llama-index, and recalled by similarity within a fault class -
"seen before: inc-..., fixed by rollback, verified"."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import (
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from agents.agent import Agent
from agents.memory import LazyMemory
from agents.memory_index import DuckDBVectorStore, IncidentMemory, MiniLMEmbedding
from agents.tools import Toolbox
from aiops.schema import ACTIONS
from aiops.store import Store
from tests.agents.scenario import slow_canary
from tests.aiops.analytics.telemetry import NS, T0


@pytest.fixture(scope="module")
def embed() -> MiniLMEmbedding:
    return MiniLMEmbedding()


def test_the_vector_store_ranks_filters_excludes_and_persists(
        tmp_path: Path, embed: MiniLMEmbedding) -> None:
    path = tmp_path / "memory.duckdb"
    store = DuckDBVectorStore(path)
    texts = {"a": ("latency", "the chat model answers slowly after a canary"),
             "b": ("errors", "the chat model returns 500 errors after a config change"),
             "c": ("latency", "the embeddings model is slow under load")}
    store.add([TextNode(id_=k, text=t, metadata={"fault_class": fc},
                        embedding=embed.get_text_embedding(t)) for k, (fc, t) in texts.items()])
    store.close()
    store = DuckDBVectorStore(path)  # reopened: the memory outlives the process
    q = embed.get_query_embedding("a slow canary of the chat model")
    top = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3))
    assert top.ids is not None and top.ids[0] == "a" and len(top.ids) == 3
    assert top.similarities is not None and top.similarities == sorted(top.similarities,
                                                                       reverse=True)
    errors = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3,
                                          filters=MetadataFilters(filters=[
                                              MetadataFilter(key="fault_class",
                                                             value="errors")])))
    assert errors.ids == ["b"]
    rest = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3),
                       exclude_ids=["a"]).ids
    assert rest is not None and sorted(rest) == ["b", "c"]
    store.close()


def _resolved_rollback(store: Store, t0: int) -> str:
    """A slow canary of echo at ``t0``, resolved, with a verified rollback on record."""
    analyzer = slow_canary(store, t0)
    for k in range(5, 120, 5):  # no traffic after t0: the SLIs recover, the incident resolves
        analyzer.step(t0 + k * NS)
    incident_id = store.query("SELECT incident_id FROM incidents_current "
                              "WHERE status = 'resolved' AND service = 'echo'").rows[0][0]
    row = {"action_id": "act-0000000000a1", "incident_id": incident_id,
           "created_at": t0 + 10 * NS, "kind": "rollback", "target": "echo@v2",
           "params": "{}", "mode": "auto", "status": "verified",
           "outcome": json.dumps({"recovered_after_s": 12}), "updated_at": t0 + 30 * NS}
    store.append("actions", pa.Table.from_pylist([row], schema=ACTIONS.arrow_schema))
    return str(incident_id)


def test_a_new_incident_like_a_resolved_one_says_seen_before_and_how_it_was_fixed(
        store: Store, embed: MiniLMEmbedding) -> None:
    old = _resolved_rollback(store, T0 - 3600 * NS)
    slow_canary(store, T0)  # the same fault again, an hour later
    memory = LazyMemory(None)
    memory._memory = IncidentMemory(None, embed)  # the module's model, loaded once
    answer = Agent(Toolbox(store, now=lambda: T0, memory=memory)).ask(
        "What happened to echo in the last 15 minutes?")
    assert answer.facts is not None and answer.facts.incident_id != old
    seen = [e for e in answer.evidence if e.kind == "memory"]
    assert seen and seen[0].id == old
    assert f"seen before: {old} (latency on echo@v2), fixed by rollback, verified" \
        in seen[0].text and seen[0].text in answer.text
    # The planner's reason gets the same line.
    assert memory.seen_before(store, answer.facts.incident_id) == seen[0].text


def test_nothing_is_seen_before_without_a_resolved_incident_of_the_same_class(
        store: Store, embed: MiniLMEmbedding) -> None:
    slow_canary(store, T0)
    memory = IncidentMemory(None, embed)
    assert memory.remember(store) == 0  # open incidents are not remembered yet
    [incident_id] = [r[0] for r in store.query(
        "SELECT incident_id FROM incidents_current WHERE service = 'echo'").rows]
    assert memory.similar(store, incident_id) == []


def test_the_planner_never_waits_for_the_memory_to_load() -> None:
    import time

    memory = LazyMemory(None)
    started = time.monotonic()
    assert memory.get(wait=False) is None  # loading begins in the background
    assert time.monotonic() - started < 0.5
    deadline = time.monotonic() + 60
    while memory.get(wait=False) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert memory.get(wait=False) is not None
    memory.close()

"""The incident memory's index: llama-index over a DuckDB vector table, embeddings from the
stack's MiniLM (see ``agents.memory``)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, TextNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from pydantic import PrivateAttr

from agents.memory import ACTIONS_SQL, INCIDENT_SQL, MIN_SCORE, RESOLVED_SQL, Recalled, describe
from aiops.store import Store

__all__ = ["DuckDBVectorStore", "IncidentMemory", "MiniLMEmbedding"]

DIM = 384  # all-MiniLM-L6-v2
BATCH = 200  # incidents indexed per remember()


class MiniLMEmbedding(BaseEmbedding):
    """llama-index embeddings from the stack's own embedding model, in-process."""

    _backend: Any = PrivateAttr()
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model_name="minilm-l6-v2", embed_batch_size=32, **kwargs)
        from serve.backends.onnx_embedding import OnnxEmbeddingBackend
        from serve.specs import DEFAULT_SPECS_FILE, load_specs

        spec = next(s for s in load_specs(DEFAULT_SPECS_FILE) if s.name == "minilm-l6-v2")
        self._backend = OnnxEmbeddingBackend(spec)
        self._backend.start()

    def _embed(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            return [list(v) for v in self._backend.embed(texts).vectors]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


class DuckDBVectorStore(BasePydanticVectorStore):
    """A llama-index vector store in a DuckDB file (``None``: in memory)."""

    stores_text: bool = True
    path: str | None = None
    _conn: Any = PrivateAttr()
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(stores_text=True, path=str(path) if path is not None else None)
        self._conn = duckdb.connect(self.path or ":memory:")
        self._conn.execute(f"""CREATE TABLE IF NOT EXISTS memory (
            node_id VARCHAR PRIMARY KEY, ref_doc_id VARCHAR, text VARCHAR,
            metadata VARCHAR, embedding FLOAT[{DIM}])""")

    @property
    def client(self) -> Any:
        return self._conn

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        rows = [(n.node_id, n.ref_doc_id, n.get_content(), json.dumps(n.metadata),
                 n.get_embedding()) for n in nodes]
        with self._lock:
            self._conn.executemany(
                "INSERT OR REPLACE INTO memory VALUES (?, ?, ?, ?, ?)", rows)
        return [r[0] for r in rows]

    def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM memory WHERE ref_doc_id = ?", [ref_doc_id])

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        if query.query_embedding is None:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        exclude = list(kwargs.get("exclude_ids") or [])
        where = ["NOT list_contains(?::VARCHAR[], node_id)"]
        params: list[Any] = [exclude]
        for f in (query.filters.filters if query.filters else []):
            # Equality on a metadata key: all this memory's recall needs.
            if not isinstance(f, MetadataFilter) or f.operator != FilterOperator.EQ \
                    or not re.fullmatch(r"[a-z_]{1,32}", f.key):
                raise ValueError(f"unsupported filter {f!r}: equality on a metadata key only")
            where.append(f"json_extract_string(metadata, '$.{f.key}') = ?")
            params.append(str(f.value))
        with self._lock:
            rows = self._conn.execute(f"""
                SELECT node_id, text, metadata,
                       array_cosine_similarity(embedding, ?::FLOAT[{DIM}]) AS score
                FROM memory WHERE {" AND ".join(where)}
                ORDER BY score DESC, node_id LIMIT ?""",
                [query.query_embedding, *params, query.similarity_top_k]).fetchall()
        nodes = [TextNode(id_=r[0], text=r[1], metadata=json.loads(r[2])) for r in rows]
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(r[3]) for r in rows],
                                      ids=[r[0] for r in rows])

    def known(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._conn.execute("SELECT node_id FROM memory").fetchall()}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class IncidentMemory:
    """Past incidents by similarity, over one vector file; safe to share between threads."""

    def __init__(self, path: Path | None = None, embed_model: BaseEmbedding | None = None,
                 min_score: float = MIN_SCORE) -> None:
        self.vectors = DuckDBVectorStore(path)
        self.embed_model = embed_model or MiniLMEmbedding()
        self.index = VectorStoreIndex.from_vector_store(self.vectors,
                                                        embed_model=self.embed_model)
        self.min_score = min_score
        self._lock = threading.Lock()

    def remember(self, store: Store) -> int:
        """Index every resolved incident of ``store`` not indexed yet; returns how many."""
        with self._lock:
            known = self.vectors.known()
            rows = store.query(RESOLVED_SQL, [], 10_000)
            new = [dict(zip(rows.columns, r, strict=True)) for r in rows.rows]
            new = [r for r in new if r["incident_id"] not in known][:BATCH]
            if not new:
                return 0
            acts = store.query(ACTIONS_SQL, [[r["incident_id"] for r in new]], 10_000)
            actions: dict[str, list[tuple[str, str]]] = {}
            for incident_id, kind, status in acts.rows:
                actions.setdefault(incident_id, []).append((kind, status))
            nodes = []
            for r in new:
                done = actions.get(r["incident_id"], [])
                # The action that mattered: a verified one, else the last taken.
                fix = next((a for a in done if a[1] == "verified"), done[-1] if done else None)
                nodes.append(TextNode(id_=r["incident_id"], text=describe(r), metadata={
                    "service": r["service"], "version": r["model_version"],
                    "fault_class": r["fault_class"], "closed": r["closed"],
                    "fix": fix[0] if fix else None, "outcome": fix[1] if fix else None}))
            self.index.insert_nodes(nodes)
            return len(nodes)

    def recall(self, text: str, fault_class: str | None = None, exclude: Sequence[str] = (),
               k: int = 3, min_score: float | None = None) -> list[Recalled]:
        """The past incidents most like ``text`` (above the similarity floor), best first;
        with ``fault_class``, only those of the same class: a pattern "seen before" is the
        same kind of failure, found by what else it shared (service, signals, wording)."""
        embedding = self.embed_model.get_query_embedding(text)
        filters = MetadataFilters(filters=[MetadataFilter(key="fault_class", value=fault_class)]
                                  ) if fault_class else None
        result = self.vectors.query(VectorStoreQuery(query_embedding=embedding,
                                                     similarity_top_k=k, filters=filters),
                                    exclude_ids=list(exclude))
        out = []
        for node, score in zip(result.nodes or [], result.similarities or [], strict=True):
            if score < (self.min_score if min_score is None else min_score):
                continue
            m = node.metadata
            out.append(Recalled(node.node_id, round(score, 3), str(m.get("service")),
                                m.get("version"), m.get("fault_class"), m.get("fix"),
                                m.get("outcome")))
        return out

    def similar(self, store: Store, incident_id: str, k: int = 3) -> list[Recalled]:
        """Past incidents like one in ``store`` (remembering what resolved since last time)."""
        self.remember(store)
        rows = store.query(INCIDENT_SQL, [incident_id], 1)
        if not rows.rows:
            return []
        row = dict(zip(rows.columns, rows.rows[0], strict=True))
        return self.recall(describe(row), row["fault_class"], exclude=[incident_id], k=k)

    def close(self) -> None:
        self.vectors.close()



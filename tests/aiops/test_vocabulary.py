"""The front door's service name is one word of the vocabulary: ``aiops.identity.INGRESS_SERVICE``
(SQL: ``aiops.semconv.INGRESS_SQL`` / ``NOT_INGRESS_SQL``). A runtime module that spells it
as a literal, in Python or inside SQL, would drift from it the day it is renamed; this test
finds every such literal in the shipped packages."""

from __future__ import annotations

import ast
from pathlib import Path

from aiops import semconv
from aiops.identity import INGRESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aiops", "agents", "serve", "dashboards", "collectors")
# The harness (benchmarks, evaluations, the demo's scripted traffic) writes fixtures of its own.
HARNESS = ("aiops/bench/", "aiops/evals/", "aiops/demo/", "agents/evals/")
ALLOWED = {
    "aiops/identity.py": "defines it",
    "aiops/k8s/network.py": "a Kubernetes NetworkPolicy's `ingress` rules, not the service",
}


def literal_uses() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(HARNESS) or rel in ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                        node.value == INGRESS_SERVICE or f"'{INGRESS_SERVICE}'" in node.value):
                    found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_runtime_module_spells_the_ingress_service_as_a_literal() -> None:
    assert literal_uses() == []


def test_the_sql_predicates_name_the_same_service() -> None:
    assert f"service_name = '{INGRESS_SERVICE}'" == semconv.INGRESS_SQL
    assert f"service_name <> '{INGRESS_SERVICE}'" == semconv.NOT_INGRESS_SQL

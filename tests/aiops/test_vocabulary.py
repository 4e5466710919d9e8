"""One vocabulary. The front door's service name is one word: ``aiops.identity.INGRESS_SERVICE``
(SQL: ``aiops.semconv.INGRESS_SQL`` / ``NOT_INGRESS_SQL``). The attributes a row's identity is
read from (model, release, replica, deployment, app) are named once, in ``aiops.identity`` and
``aiops.semconv``'s conventions table, and read by every reader through the typed columns the
store derives from them. A runtime module that spells one as a literal, in Python or inside
SQL, would drift from it the day it is renamed; these tests find every such literal in the
shipped packages."""

from __future__ import annotations

import ast
from pathlib import Path

from aiops import semconv
from aiops.identity import INGRESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aiops", "agents", "serve", "dashboards", "collectors")
ALLOWED = {
    "aiops/identity.py": "defines it",
    "aiops/k8s/network.py": "a Kubernetes NetworkPolicy's `ingress` rules, not the service",
}


# The attribute keys the typed identity columns are read from, and where they are defined.
IDENTITY_KEYS = {key for columns in semconv.CONVENTIONS.values() for sources in columns.values()
                 for s in sources for key in (s.key if s.where != "component"
                                              else semconv.RAY_COMPONENT_LABEL,)}
VOCABULARY = ("aiops/identity.py", "aiops/semconv.py")


def literal_uses(words: set[str], allowed: dict[str, str] | tuple[str, ...],
                 keys: bool = False) -> list[str]:
    """Every string constant in a runtime module that is one of ``words`` or quotes one
    (``'word'`` inside SQL). Of attribute ``keys``, a plain label word (``Component``,
    ``model_name``) is also a Python name elsewhere: only its JSON reads (``->>'word'``)
    count."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                        f"->>'{w}'" in node.value or (not (keys and w.isidentifier()) and (
                            node.value == w or f"'{w}'" in node.value)) for w in words):
                    found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_runtime_module_spells_the_ingress_service_as_a_literal() -> None:
    assert literal_uses({INGRESS_SERVICE}, ALLOWED) == []


def test_no_runtime_module_spells_an_identity_attribute_as_a_literal() -> None:
    """Readers use the typed columns (``model``, ``model_version``, ``replica``, ``deployment``,
    ``app``); writers the constants. The conventions table names every key it reads."""
    assert {semconv.MODEL_ATTR, semconv.MODEL_VERSION_ATTR, semconv.SERVICE_VERSION_ATTR,
            semconv.REPLICA_ATTR, "ray.serve.deployment", "ray.serve.app"} <= IDENTITY_KEYS
    assert literal_uses(IDENTITY_KEYS, VOCABULARY, keys=True) == []


def test_the_sql_predicates_name_the_same_service() -> None:
    assert f"service_name = '{INGRESS_SERVICE}'" == semconv.INGRESS_SQL
    assert f"service_name <> '{INGRESS_SERVICE}'" == semconv.NOT_INGRESS_SQL

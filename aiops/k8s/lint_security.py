"""``aiops k8s lint``'s security rules: secrets in clear, and Ray pods no NetworkPolicy fences.

- ``secrets``: no secret value anywhere but in a Secret. In every other document (and in a
  RayService's ``serveConfigV2``, parsed as the YAML it is) the rule reports
  - a secret-named key with a literal value: ``token: ...``, ``api_keys: [...]``, a
    runtime_env's ``SLACK_SIGNING_SECRET: ...``, a ConfigMap's ``serve.token``;
  - a secret-named env var with a literal ``value`` (``valueFrom.secretKeyRef`` is the way);
  - a secret-named command-line flag with a value: ``--token=...``, ``--api-key ...``;
  - a bearer token anywhere: ``Authorization: Bearer ...``, OTLP headers.
  A name is secret-named when one of its words is token, secret, password, credential... or
  it ends like ``api_key``, ``access_key``, ``private_key``. A name whose last word is file,
  path, ref, name, url, mode... says where a secret is, not what, and passes
  (``token_file``, ``secretKeyRef``, ``secretName``).
- ``network``: every Ray pod (a RayService's or RayCluster's head and worker groups) is
  selected by an ingress NetworkPolicy among the manifests linted together (same namespace),
  and no rule of those admits every source to every port, nor, on the head, to the GCS
  (6379), dashboard (8265) or client (10001) port. Ray's ports run code for whoever reaches
  them; without a policy, that is every pod of the cluster. Pods are matched with the labels
  KubeRay gives them too (``ray.io/node-type``, ``ray.io/group``, RayCluster's
  ``ray.io/cluster``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import yaml

__all__ = ["Issue", "network_issues", "secret_issues", "secret_named"]

# (resource, path, rule, message): aiops.k8s.lint makes Findings of them.
Issue = tuple[str, str, str, str]

_WORDS = frozenset({"token", "secret", "password", "passwd", "passphrase", "apikey",
                    "privatekey", "credential", "credentials"})
_PAIRS = frozenset({("api", "key"), ("api", "keys"), ("access", "key"), ("secret", "key"),
                    ("private", "key"), ("signing", "key"), ("auth", "key"),
                    ("encryption", "key"), ("client", "secret")})
# Last words of names that say where or what kind a secret is, never the secret itself.
_REFERENCES = frozenset({"file", "files", "path", "paths", "dir", "ref", "name", "names",
                         "url", "mode", "id", "type", "kind", "role", "ttl", "header",
                         "length", "size", "count", "version", "enabled", "required", "env"})
_BEARER = re.compile(r"\bbearer(?:\s+|%20)(?![$<{])[\w.~+/=-]{16,}", re.IGNORECASE)
_FLAG_VALUE = re.compile(r"(?:^|\s)--?([A-Za-z][\w.-]*)=(\S+)")
_FLAG = re.compile(r"^--?([A-Za-z][\w.-]*)$")
_SECRET_HINT = ("reference a Secret (env valueFrom.secretKeyRef) or mount it as a file")


def secret_named(name: str) -> bool:
    """Whether a key, env var or flag named ``name`` would hold a secret."""
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", snake) if w]
    if not words or words[-1] in _REFERENCES:
        return False
    return any(w in _WORDS for w in words) or any(p in _PAIRS for p in pairwise(words))


def _literal(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list):
        return any(isinstance(v, str) and v.strip() for v in value)
    return False


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def secret_issues(resource: str, doc: dict[str, Any]) -> list[Issue]:
    """The ``secrets`` rule for one document (a Secret is where secrets belong: none)."""
    if doc.get("kind") == "Secret":
        return []
    return [(resource, path, "secrets", message) for path, message in _walk(doc, "")]


def _walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        name = node.get("name")
        env_style = isinstance(name, str) and secret_named(name) and _literal(node.get("value"))
        if env_style:
            yield (_join(path, "value"),
                   f"{name} is set to a literal value: {_SECRET_HINT}")
        for key, value in node.items():
            sub = _join(path, str(key))
            if key == "value" and env_style:
                continue
            if isinstance(key, str) and secret_named(key) and _literal(value):
                yield sub, f"{key} holds a literal value: {_SECRET_HINT}"
            elif key in ("command", "args") and isinstance(value, list):
                yield from _flags(value, sub)
            elif key == "serveConfigV2" and isinstance(value, str):
                yield from _serve_config(value, sub)
            else:
                yield from _walk(value, sub)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(node, str) and _BEARER.search(node):
        yield path, f"a bearer token in clear: {_SECRET_HINT}"


def _flags(argv: list[Any], path: str) -> Iterator[tuple[str, str]]:
    items = [a if isinstance(a, str) else "" for a in argv]
    for i, item in enumerate(items):
        here = f"{path}[{i}]"
        named = [m[1] for m in _FLAG_VALUE.finditer(item) if secret_named(m[1])]
        flag = _FLAG.match(item)
        if (flag and secret_named(flag[1]) and i + 1 < len(items)
                and items[i + 1] and not items[i + 1].startswith("-")):
            named.append(flag[1])
            here = f"{path}[{i + 1}]"
        for name in named:
            yield here, f"flag --{name} is given a literal value: {_SECRET_HINT}"
        if not named and _BEARER.search(item):
            yield here, f"a bearer token in clear: {_SECRET_HINT}"


def _serve_config(text: str, path: str) -> Iterator[tuple[str, str]]:
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        if _BEARER.search(text):
            yield path, f"a bearer token in clear: {_SECRET_HINT}"
        return
    for inner, message in _walk(config, ""):
        yield f"{path}:{inner}", f"Serve config: {message}"


# --- network ---------------------------------------------------------------------------

_CONTROL_PORTS = frozenset({6379, 8265, 10001, "gcs", "gcs-server", "dashboard", "client"})
_EXPOSED = {"head": "its GCS (6379), dashboard (8265) and client (10001) ports",
            "worker": "its raylet, object manager and worker ports"}


def _get(doc: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _ray_pods(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(path of the pod template, node type, the labels the pod will carry)."""
    kind, name = doc.get("kind"), _get(doc, "metadata.name")
    if kind not in ("RayService", "RayCluster"):
        return
    cluster = "spec.rayClusterConfig" if kind == "RayService" else "spec"
    defaults = {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
                "app.kubernetes.io/created-by": "kuberay-operator"}
    fixed = {"ray.io/cluster": str(name)} if kind == "RayCluster" else {}
    groups: list[tuple[str, str, Any, str]] = [
        (f"{cluster}.headGroupSpec.template", "head",
         _get(doc, f"{cluster}.headGroupSpec.template"), "headgroup")]
    for i, group in enumerate(_get(doc, f"{cluster}.workerGroupSpecs") or []):
        if isinstance(group, dict):
            groups.append((f"{cluster}.workerGroupSpecs[{i}].template", "worker",
                           group.get("template"), str(group.get("groupName"))))
    for path, node_type, template, group_name in groups:
        if isinstance(template, dict):
            own = _get(template, "metadata.labels") or {}
            yield path, node_type, {**defaults, **own, **fixed, "ray.io/node-type": node_type,
                                    "ray.io/group": group_name}


def _selects(selector: Any, labels: dict[str, str]) -> bool:
    if not isinstance(selector, dict):
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": labels.get(key) in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _fences(policy: dict[str, Any], namespace: Any, labels: dict[str, str]) -> bool:
    """Whether ``policy`` restricts ingress to a pod with ``labels`` in ``namespace``."""
    own = _get(policy, "metadata.namespace")
    if own is not None and namespace is not None and own != namespace:
        return False
    types = _get(policy, "spec.policyTypes")
    return (types is None or "Ingress" in types) and _selects(
        _get(policy, "spec.podSelector"), labels)


def _every_source(rule: dict[str, Any]) -> bool:
    peers = rule.get("from")
    if not peers:
        return True
    for peer in peers:
        if not isinstance(peer, dict):
            continue
        if (peer.get("ipBlock") or {}).get("cidr") in ("0.0.0.0/0", "::/0"):
            return True
        if peer.get("namespaceSelector") == {} and not peer.get("podSelector"):
            return True
    return False


def _open_ports(rule: dict[str, Any], node_type: str) -> str | None:
    """What of a Ray pod ``rule`` opens to every source, if it matters."""
    if not _every_source(rule):
        return None
    ports = rule.get("ports")
    if not ports or any(isinstance(p, dict) and "port" not in p for p in ports):
        return "every port"
    if node_type != "head":
        return None
    hits = []
    for p in ports:
        port, end = p.get("port"), p.get("endPort")
        if port in _CONTROL_PORTS:
            hits.append(str(port))
        elif isinstance(port, int) and isinstance(end, int):
            hits += [str(c) for c in sorted(_CONTROL_PORTS, key=str)
                     if isinstance(c, int) and port <= c <= end]
    return f"port {', '.join(hits)}" if hits else None


def network_issues(resource: str, doc: dict[str, Any], policies: list[dict[str, Any]]
                   ) -> list[Issue]:
    """The ``network`` rule for one document, given every NetworkPolicy linted with it."""
    out: list[Issue] = []
    namespace = _get(doc, "metadata.namespace")
    for path, node_type, labels in _ray_pods(doc):
        fencing = [p for p in policies if _fences(p, namespace, labels)]
        if not fencing:
            out.append((resource, f"{path}.metadata.labels", "network",
                        f"no NetworkPolicy selects the Ray {node_type} pod: "
                        f"{_EXPOSED[node_type]} are open to every pod"))
        for policy in fencing:
            for i, rule in enumerate(_get(policy, "spec.ingress") or []):
                opened = _open_ports(rule, node_type) if isinstance(rule, dict) else None
                if opened:
                    out.append((f"NetworkPolicy/{_get(policy, 'metadata.name')}",
                                f"spec.ingress[{i}]", "network",
                                f"admits every source to {opened} of the Ray {node_type} "
                                f"of {resource}"))
    return out

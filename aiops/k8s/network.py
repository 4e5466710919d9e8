"""NetworkPolicies for ``aiops k8s render``: ingress denied to every aiops pod, then allowed
only where a component needs it.

Why: the Ray head listens on its GCS (6379), dashboard (8265, bound to all interfaces so that
the KubeRay operator can reach it through the head Service), client (10001) and a range of
raylet, object-manager and worker ports; whoever reaches those can run code in the cluster.
Without a policy every pod of the Kubernetes cluster can. So:

- ``aiops-default-deny``: every pod labelled ``app.kubernetes.io/name: aiops`` (the server,
  the eBPF collector, the Ray head and workers) admits nothing not allowed below;
- ``aiops-ray``: the Ray pods of this RayService admit each other on every port (Ray's own
  ports are partly random), the aiops server on Ray's metrics port (its scrape), and the Serve
  proxy port (the OpenAI endpoints, which require the API key) from every source, or only the
  server, the KubeRay operator and ``serve_from``'s CIDRs when given;
- ``aiops-ray-dashboard``: the head admits the KubeRay operator on the dashboard port (it
  deploys ``serveConfigV2`` and reads Serve's status through the dashboard's REST API);
- ``aiops-server``: the server's OTLP/API port admits the Ray pods (telemetry), the eBPF
  collector and Grafana (a pod labelled ``app.kubernetes.io/name: grafana``, any namespace).

The operator is matched as a pod labelled ``app.kubernetes.io/component: kuberay-operator`` (in
``operator_namespace``, else any namespace); an operator run with ``--use-kubernetes-proxy``
reaches Ray through the API server instead, which these policies do not admit. Probes are
``exec`` checks inside the containers, or (the server's) kubelet HTTP checks from
the node, which common CNIs (Calico, Cilium) admit whatever the policies say; ``kubectl
port-forward`` enters the pod's own network namespace and is not filtered either. Egress is
not restricted.
"""

from __future__ import annotations

from typing import Any

__all__ = ["APP_LABELS", "COMPONENT", "INSTANCE", "component_labels", "network_policies",
           "ray_pod_labels"]

COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"
APP_LABELS = {"app.kubernetes.io/name": "aiops"}
RAY_COMPONENTS = ("ray-head", "ray-worker")
# How the KubeRay operator's pods are labelled, by its Helm chart and by its kustomize
# manifests alike.
OPERATOR_LABELS = {COMPONENT: "kuberay-operator"}
GRAFANA_LABELS = {"app.kubernetes.io/name": "grafana"}


def component_labels(component: str) -> dict[str, str]:
    return {**APP_LABELS, COMPONENT: component}


def ray_pod_labels(rayservice: str, component: str) -> dict[str, str]:
    """A Ray pod's own labels: KubeRay keeps them (it only sets ``ray.io/node-type``,
    ``ray.io/group`` and ``ray.io/cluster`` itself), so the policies can select on them;
    ``app.kubernetes.io/instance`` names the RayService, telling its pods from any other's."""
    return {**component_labels(component), INSTANCE: rayservice}


def _ray_pods(rayservice: str, components: tuple[str, ...] = RAY_COMPONENTS
              ) -> dict[str, Any]:
    return {"matchLabels": {**APP_LABELS, INSTANCE: rayservice},
            "matchExpressions": [{"key": COMPONENT, "operator": "In",
                                  "values": list(components)}]}


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def _any_namespace(labels: dict[str, str], namespace: str | None = None) -> dict[str, Any]:
    ns: dict[str, Any] = ({"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                          if namespace else {})
    return {"namespaceSelector": ns, "podSelector": {"matchLabels": dict(labels)}}


def _policy(name: str, namespace: str, selector: dict[str, Any],
            ingress: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": ["Ingress"]}
    if ingress:
        spec["ingress"] = ingress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": component_labels("network")},
            "spec": spec}


def network_policies(namespace: str, rayservice: str, *, server: dict[str, str],
                     server_port: int, serve_port: int, metrics_port: int,
                     dashboard_port: int, ebpf: dict[str, str] | None,
                     operator_namespace: str | None = None,
                     serve_from: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The policies above; ``server`` and ``ebpf`` are those pods' labels (``ebpf`` None when
    the collector is not rendered)."""
    ray_pods = _ray_pods(rayservice)
    server_peer = {"podSelector": {"matchLabels": dict(server)}}
    operator = _any_namespace(OPERATOR_LABELS, operator_namespace)
    # Serve's port: by default from every source (clients come through the Service, an
    # Ingress controller or a load balancer, whose addresses are not known here); the API
    # key guards it. With serve_from, only those CIDRs, the server's agent and the operator
    # (it checks the head's proxy, /-/healthz, to put the head behind the serve Service).
    serve_peers = ([server_peer, operator, *({"ipBlock": {"cidr": c}} for c in serve_from)]
                   if serve_from else None)
    serve_rule: dict[str, Any] = {"ports": _ports(serve_port)}
    if serve_peers:
        serve_rule = {"from": serve_peers, **serve_rule}
    otlp_peers = [{"podSelector": ray_pods}, _any_namespace(GRAFANA_LABELS)]
    if ebpf is not None:
        otlp_peers.insert(1, {"podSelector": {"matchLabels": dict(ebpf)}})
    return [
        _policy("aiops-default-deny", namespace, {"matchLabels": dict(APP_LABELS)}, []),
        _policy("aiops-ray", namespace, ray_pods, [
            # GCS, raylets, object managers, dashboard agents, workers: Ray's ports, some
            # chosen at random, between the pods of this one cluster only.
            {"from": [{"podSelector": ray_pods}]},
            {"from": [server_peer], "ports": _ports(metrics_port)},
            serve_rule,
        ]),
        _policy("aiops-ray-dashboard", namespace, _ray_pods(rayservice, ("ray-head",)), [
            {"from": [operator], "ports": _ports(dashboard_port)},
        ]),
        _policy("aiops-server", namespace, {"matchLabels": dict(server)}, [
            {"from": otlp_peers, "ports": _ports(server_port)},
        ]),
    ]

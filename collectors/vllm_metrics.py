"""A vLLM server's Prometheus metrics under the names the project's own serving emits.

An attached ``vllm serve`` exposes ``vllm:*`` metrics labelled with ``model_name``. Scraped as
they are, they land under the scrape job; the dashboards, the server's OTLP re-exposition
(``/metrics/otlp``) and analytics read the OpenTelemetry GenAI / aiops names, labelled by
``gen_ai.request.model`` and ``aiops.model.version``, with the model as the service. This
module adds those rows beside the raw ones, so an attached vLLM model shows in the same panels
and queries as one aiops serves itself.

Only what means the same on both sides is mapped: KV-cache usage, running and waiting
requests, and the request latency, time-to-first-token and time-per-output-token histograms.
"""

from __future__ import annotations

from typing import Any

import orjson

from aiops import semconv

__all__ = ["NAMES", "SCOPE", "normalize"]

# Rows with this scope are the server's own translation: /metrics/otlp exposes them (the raw
# scraped rows are not re-exposed: Prometheus can scrape vLLM itself).
SCOPE = "aiops.attach.vllm"

# vLLM's name -> (the project's name, OpenTelemetry unit).
NAMES: dict[str, tuple[str, str]] = {
    "vllm:kv_cache_usage_perc": ("aiops.model.kv_cache.usage", "1"),
    "vllm:num_requests_running": ("aiops.serve.in_flight", "{request}"),
    "vllm:num_requests_waiting": ("aiops.serve.queue_depth", "{request}"),
    "vllm:e2e_request_latency_seconds": ("gen_ai.server.request.duration", "s"),
    "vllm:time_to_first_token_seconds": ("gen_ai.server.time_to_first_token", "s"),
    "vllm:request_time_per_output_token_seconds": ("gen_ai.server.time_per_output_token", "s"),
}


def normalize(rows: list[dict[str, Any]], target: str, version: str | None
              ) -> list[dict[str, Any]]:
    """The project-named copies of the mappable rows among ``rows`` (metric_points rows from
    one scrape of vLLM server ``target``); ``version`` is what stands for the model's version
    (vLLM has none: the attachment passes the served model's tag)."""
    out = []
    for row in rows:
        mapped = NAMES.get(row["name"])
        if mapped is None:
            continue
        labels: dict[str, Any] = orjson.loads(row["attributes"] or "{}")
        model = labels.pop(semconv.VLLM_MODEL_LABEL, None)
        if not model:
            continue
        engine = labels.get("engine", "0")
        attributes = {**labels, semconv.MODEL_ATTR: model, "gen_ai.system": "vllm"}
        resource = {"service.name": model, "service.instance.id": f"{target}/{engine}",
                    "aiops.attach.target": target}
        if version:
            attributes[semconv.MODEL_VERSION_ATTR] = version
            resource[semconv.SERVICE_VERSION_ATTR] = version
        out.append({**row, "name": mapped[0], "unit": mapped[1], "service_name": model,
                    "scope_name": SCOPE, "resource_attributes": orjson.dumps(resource).decode(),
                    "attributes": orjson.dumps(attributes).decode()})
    return out

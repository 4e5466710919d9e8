"""Units, what the telemetry SDKs put in every row, and the models served
(serve/models.yaml, tests/models-analytics.yaml)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

NS = 1_000_000_000
MS = 1_000_000
HISTORY_S = 360  # seconds of telemetry before "now" (the default)
SDK = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
       "telemetry.sdk.version": "1.45.2"}
OTEL_BOUNDS = [0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0,
               5000.0, 7500.0, 10000.0]  # the SDK's default explicit bounds
EBPF_BOUNDS = [2.0 ** (k + 1) / 1e6 for k in range(23)]  # collectors.ebpf.probes.BOUNDS_S
INFO, WARN, ERROR = (9, "INFO"), (13, "WARN"), (17, "ERROR")



# -- the models (serve/models.yaml, tests/models-analytics.yaml) --------------------------------

@dataclass(frozen=True)
class Model:
    name: str
    backend: str
    model_type: str  # llm, embedding, vision
    route: str
    operation: str  # the model span is "<operation> <name>"
    p95_ms: float
    error_rate: float
    max_ongoing: int
    max_queue: int
    artifact: bool = True
    priority: str = "realtime"  # qos.priority: its admission queue

    def digest(self, version: str) -> str:
        if not self.artifact:
            return "none"
        return "sha256:" + hashlib.sha256(f"{self.name}:{version}".encode()).hexdigest()


CHAT = Model("smollm2-135m-instruct", "llama_cpp", "llm", "/v1/chat/completions", "chat",
             4000, 0.01, 2, 16)
EMBED = Model("minilm-l6-v2", "onnx_embedding", "embedding", "/v1/embeddings", "embeddings",
              200, 0.01, 8, 64, priority="batch")
OCR = Model("ppocr-v4", "onnx_ocr", "vision", "/v1/chat/completions", "vision", 2000, 0.01, 2, 8)
ECHO = Model("echo", "echo", "llm", "/v1/chat/completions", "chat", 100, 0.05, 8, 64,
             artifact=False)

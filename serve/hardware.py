"""What hardware a replica runs on, as a stable fingerprint for provenance entries."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["fingerprint", "hardware_info"]


@cache
def hardware_info(proc: Path = Path("/proc")) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in (proc / "cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = 0.0
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": cpu, "cpus": os.cpu_count() or 0,
            "memory_gb": memory_gb, "accelerators": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


@cache
def fingerprint() -> str:
    body = json.dumps(hardware_info(), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(body).hexdigest()

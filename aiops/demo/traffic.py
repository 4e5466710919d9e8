"""Mixed traffic for the demo: chat, streaming chat, embeddings and images (OCR), from a few
client threads, with every request's outcome kept for the live display and the report."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

__all__ = ["Sample", "Traffic", "Workload"]

CHAT = "smollm2-135m-instruct"
EMBED = "minilm-l6-v2"
VISION = "ppocr-v4"
PROMPTS = ("Paris is the capital of which country?", "Name three primary colors.",
           "What is 12 times 12?", "Say hello in French.")


@dataclass(frozen=True)
class Sample:
    end: float  # wall clock
    kind: str  # chat, stream, embed, image
    model: str
    version: str  # as the answer's x-aiops-model-version header said ("" when none)
    seconds: float
    status: int  # HTTP status; 0 for a transport error


@dataclass(frozen=True)
class Workload:
    kind: str
    model: str
    pause_s: float  # between two requests of one client


# Paced to leave the 2-core machine some headroom: saturated CPUs are an incident of their own.
DEFAULT_WORKLOADS = (Workload("chat", CHAT, 0.5), Workload("stream", CHAT, 1.0),
                     Workload("embed", EMBED, 0.5), Workload("image", VISION, 5.0))


def _image() -> str:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (200, 48), "white")
    ImageDraw.Draw(img).text((8, 16), "GPU 0 OK", fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class Traffic:
    """One client thread per workload, until ``close``."""

    def __init__(self, serve_url: str, workloads: tuple[Workload, ...] = DEFAULT_WORKLOADS,
                 api_key: str | None = None, keep: int = 100_000) -> None:
        self.url = serve_url
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.samples: deque[Sample] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._image = _image()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True,
                                          name=f"traffic-{w.kind}") for w in workloads]
        self._n = 0

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def _request(self, c: httpx.Client, w: Workload) -> httpx.Response:
        self._n += 1
        prompt = PROMPTS[self._n % len(PROMPTS)]
        if w.kind == "embed":
            return c.post("/v1/embeddings", json={"model": w.model, "input": prompt})
        if w.kind == "image":
            return c.post("/v1/chat/completions", json={"model": w.model, "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "read it"},
                    {"type": "image_url", "image_url": {"url": self._image}}]}]})
        body = {"model": w.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 16, "temperature": 0.2}
        if w.kind == "stream":
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                for _ in r.iter_bytes():
                    pass
                return r
        return c.post("/v1/chat/completions", json=body)

    def _run(self, w: Workload) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=self.headers) as c:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    r = self._request(c, w)
                    status = r.status_code
                    version = r.headers.get("x-aiops-model-version", "")
                except httpx.HTTPError:
                    status, version = 0, ""
                self.samples.append(Sample(time.time(), w.kind, w.model, version,
                                           time.perf_counter() - started, status))
                self._stop.wait(w.pause_s)

    def window(self, seconds: float, where: Callable[[Sample], bool] = lambda s: True
               ) -> list[Sample]:
        since = time.time() - seconds
        return [s for s in list(self.samples) if s.end >= since and where(s)]

    def last_bad_after(self, t0: float, model: str, slo_s: float) -> float | None:
        """When the clients last saw a failed or too-slow request of ``model`` after t0."""
        bad = [s.end for s in list(self.samples) if s.end > t0 and s.model == model
               and (s.status != 200 or s.seconds > slo_s)]
        return max(bad) if bad else None

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

"""Mixed traffic for the demo: chat, streaming chat, embeddings and images (OCR), with every
request's outcome kept for the live display and the report.

Arrivals are open-loop (Poisson, at a fixed rate per workload), as users' requests are: a slow
version does not slow the arrivals down, so a fault shows at the rate it would in production
instead of throttling its own evidence (a closed-loop client waits out every slow request).
In-flight requests per workload are bounded; at the bound an arrival waits for a free slot.
"""

from __future__ import annotations

import base64
import io
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

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
    rate_per_s: float  # mean arrivals per second
    max_in_flight: int = 8


# Paced to leave the 2-core machine headroom: saturated CPUs are an incident of their own, and
# a model near saturation queues in bursts. Chat answers are short (8 tokens, ~0.2 s), so the
# chat model is about half busy at these rates.
DEFAULT_WORKLOADS = (Workload("chat", CHAT, 1.4), Workload("stream", CHAT, 0.7),
                     Workload("embed", EMBED, 1.5), Workload("image", VISION, 0.1))


def scaled(workloads: tuple[Workload, ...], factor: float) -> tuple[Workload, ...]:
    """The same mix at ``factor`` times its arrival rates."""
    return tuple(replace(w, rate_per_s=w.rate_per_s * factor) for w in workloads)


def _image() -> str:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (200, 48), "white")
    ImageDraw.Draw(img).text((8, 16), "GPU 0 OK", fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class Traffic:
    """One arrival thread per workload, each request on a thread of its own, until ``close``."""

    def __init__(self, serve_url: str, workloads: tuple[Workload, ...] = DEFAULT_WORKLOADS,
                 api_key: str | None = None, keep: int = 100_000, seed: int | None = None
                 ) -> None:
        self.url = serve_url
        self.workloads = workloads
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.samples: deque[Sample] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._image = _image()
        self._rng = random.Random(seed)
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
                "max_tokens": 8, "temperature": 0.2}
        if w.kind == "stream":
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                for _ in r.iter_bytes():
                    pass
                return r
        return c.post("/v1/chat/completions", json=body)

    def _run(self, w: Workload) -> None:
        slots = threading.BoundedSemaphore(w.max_in_flight)
        limits = httpx.Limits(max_connections=w.max_in_flight)
        running: list[threading.Thread] = []
        with httpx.Client(base_url=self.url, timeout=60, headers=self.headers,
                          limits=limits) as c:
            while not self._stop.wait(self._rng.expovariate(w.rate_per_s)):
                while not slots.acquire(timeout=0.5):
                    if self._stop.is_set():
                        return
                t = threading.Thread(target=self._one, args=(c, w, slots), daemon=True)
                running = [r for r in running if r.is_alive()] + [t]
                t.start()
            for t in running:  # before the client closes under them
                t.join(timeout=70)

    def _one(self, c: httpx.Client, w: Workload, slots: threading.BoundedSemaphore) -> None:
        started = time.perf_counter()
        try:
            r = self._request(c, w)
            status = r.status_code
            version = r.headers.get("x-aiops-model-version", "")
        except httpx.HTTPError:
            status, version = 0, ""
        finally:
            slots.release()
        self.samples.append(Sample(time.time(), w.kind, w.model, version,
                                   time.perf_counter() - started, status))

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

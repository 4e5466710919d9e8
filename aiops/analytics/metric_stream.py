"""Live metric anomalies on the serving signals: queue depth, KV-cache usage, token rate and
replica resident memory, each series streamed once through the live metric detector
(``aiops.analytics.metric_live.LIVE_DEFAULT``, chosen by event F0.5 on NAB and Microsoft's cloud
KPIs together).

What it reports is *context*, attached to an incident about the same model (``for_model``),
not a finding that opens one: at the chosen threshold the detector still raises a few false
alarms per series on the corpora it was chosen on (48 on NAB's 58 series, 13 on cloud_kpi's
24), and the serving signals here are many series at one point every second or two, so at that
threshold alone they would page someone several times an hour. The incident-opening rules
(SLO burn, trace shifts and tails, run-queue, CPU, memory growth, exits) stay what they are; an
anomaly in the queue or the KV cache beside them says where the pressure showed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from aiops import semconv
from aiops.analytics.anomaly import MultiSeriesDetector
from aiops.analytics.metric_live import LIVE_DEFAULT, live_multi_detector
from aiops.store import Store

__all__ = ["SIGNALS", "MetricAnomaly", "MetricStream"]

NS = 1_000_000_000

# name -> what the point's value is: a gauge as it is, or a histogram's sum (tokens per
# export interval: a rate).
SIGNALS = {"aiops.serve.queue_depth": "value", "aiops.model.kv_cache.usage": "value",
           "gen_ai.client.token.usage": "sum", "aiops.process.memory.rss": "value"}

_POINTS = f"""
SELECT name, {semconv.MODEL} AS model, {semconv.VERSION} AS version,
       coalesce({semconv.REPLICA}, (attributes->>'gen_ai.token.type'), '') AS part,
       epoch_ns(time) AS t, CASE WHEN value IS NOT NULL THEN value ELSE sum END AS v
FROM metric_points
WHERE name IN (SELECT unnest(?::VARCHAR[])) AND time > make_timestamp_ns(?)
  AND time <= make_timestamp_ns(?) AND {semconv.MODEL} IS NOT NULL
ORDER BY time
LIMIT ?
"""


@dataclass(frozen=True)
class MetricAnomaly:
    name: str
    model: str
    version: str | None
    part: str  # the replica, or the token type
    time_ns: int
    value: float
    score: float

    def evidence(self) -> dict[str, Any]:
        return {"kind": "metric_anomaly", "id": self.name, "model": self.model,
                "version": self.version, "part": self.part or None, "time_ns": self.time_ns,
                "value": self.value, "score": round(self.score, 3),
                "detector": f"{LIVE_DEFAULT.spec.key} >= {LIVE_DEFAULT.threshold:.3f}"}


class MetricStream:
    """Reads the points that arrived since the last round (at most ``max_points`` a round,
    the oldest first: a backlog is caught up over several rounds) and keeps the last
    ``keep`` anomalies."""

    def __init__(self, detector: MultiSeriesDetector | None = None, max_points: int = 50_000,
                 keep: int = 1000) -> None:
        self.detector = detector or live_multi_detector()
        self.max_points = max_points
        self.recent: deque[MetricAnomaly] = deque(maxlen=keep)
        self.points = 0
        self._since_ns: int | None = None

    def update(self, store: Store, now_ns: int, lookback_s: float = 600.0) -> int:
        """Stream the new points; returns how many anomalies they held."""
        since = self._since_ns if self._since_ns is not None else now_ns - int(lookback_s * NS)
        rows = store.query(_POINTS, [list(SIGNALS), since, now_ns, self.max_points]).rows
        found = 0
        for name, model, version, part, t, value in rows:
            since = max(since, int(t))
            if value is None:
                continue
            self.points += 1
            hit = self.detector.observe((name, model, version, part), int(t) / NS,
                                        float(value))
            if hit is not None:
                self.recent.append(MetricAnomaly(name, model, version, part, int(t),
                                                 float(value), hit.score))
                found += 1
        # A full batch: go on from its last point next round (points beyond the cap that share
        # its timestamp are skipped; the cap is far above a round's worth).
        self._since_ns = since if len(rows) >= self.max_points else now_ns
        return found

    def for_model(self, model: str, since_ns: int) -> list[dict[str, Any]]:
        return [a.evidence() for a in self.recent if a.model == model and a.time_ns >= since_ns]

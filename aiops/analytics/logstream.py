"""Live log findings: new error templates and error-template bursts, per service.

Every round reads the log records that arrived since the last one, mines their templates
(drain3, ``aiops.analytics.logs``) and counts them per service in short buckets. A template at
warning level or above that is new, or whose count jumps against its own recent buckets, is a
finding of class ``errors`` with the template and one trace that carries it as evidence.
Info-level templates follow traffic and are not findings by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiops import semconv
from aiops.analytics.findings import Entity, EvidenceKind, FaultClass, Finding
from aiops.analytics.logs import LogTemplates, TemplateAnomaly, TemplateRateDetector
from aiops.identity import INGRESS_SERVICE
from aiops.store import Store

__all__ = ["LogDetector"]

WARN = 13  # OTLP severity number of WARN
_SQL = f"""
SELECT epoch_ns(time) AS t, service_name, {semconv.VERSION} AS version,
       coalesce(severity_number, 0) AS severity, coalesce(body, '') AS body, trace_id
FROM logs
WHERE time > make_timestamp_ns(?) AND time <= make_timestamp_ns(?) AND service_name IS NOT NULL
ORDER BY time LIMIT ?
"""


@dataclass
class _Service:
    detector: TemplateRateDetector
    versions: dict[int, str | None] = field(default_factory=dict)
    traces: dict[int, str] = field(default_factory=dict)


class LogDetector:
    def __init__(self, bucket_s: float = 10.0, warmup: int = 6, max_rows: int = 50_000) -> None:
        self.templates = LogTemplates()
        self.bucket_ns = int(bucket_s * 1e9)
        self.warmup = warmup
        self.max_rows = max_rows
        self.watermark_ns: int | None = None
        self.services: dict[str, _Service] = {}
        self.severity: dict[int, int] = {}  # template id -> highest severity seen

    def findings(self, store: Store, now_ns: int) -> list[Finding]:
        # The first round warms up on the recent past, so a restart does not start blind.
        since = self.watermark_ns if self.watermark_ns is not None else \
            now_ns - (self.warmup + 2) * self.bucket_ns
        rows = store.query(_SQL, [since, now_ns, self.max_rows]).rows
        found: list[Finding] = []
        for t, service, version, severity, body, trace_id in rows:
            match = self.templates.add(body)
            tid = match.template_id
            self.severity[tid] = max(self.severity.get(tid, 0), int(severity))
            s = self.services.get(service)
            if s is None:
                s = self.services[service] = _Service(TemplateRateDetector(
                    self.bucket_ns, history=60, warmup=self.warmup))
            s.versions[tid] = version if service != INGRESS_SERVICE else None
            if trace_id:
                s.traces[tid] = trace_id
            found += self._convert(service, s, s.detector.observe(int(t), match))
            since = max(since, int(t))
        self.watermark_ns = since
        return found

    def _convert(self, service: str, s: _Service, anomalies: list[TemplateAnomaly]
                 ) -> list[Finding]:
        out = []
        for a in anomalies:
            if self.severity.get(a.template_id, 0) < WARN or a.observed <= a.expected:
                continue
            entity = Entity(service, s.versions.get(a.template_id))
            score = min(a.score / 6.0, 10.0)  # -log10 p over the threshold (new: infinite)
            evidence = [entity.evidence(EvidenceKind.LOG_TEMPLATE, a.template, FaultClass.ERRORS,
                                        f"log:{a.kind}", a.observed, a.expected, score)]
            trace = s.traces.get(a.template_id)
            if trace:
                evidence.append(entity.evidence(EvidenceKind.TRACE, trace, FaultClass.ERRORS,
                                                "a trace with this log"))
            new = "new " if a.kind == "new_template" else ""
            out.append(Finding(
                "log_template", entity, FaultClass.ERRORS, max(score, 1.0), a.window_start_ns,
                a.window_end_ns, f"{entity}: {new}log template '{a.template[:80]}' "
                f"x{a.observed:g} (expected {a.expected:.1f})", evidence))
        return out

"""One case's telemetry: the requests, spans, logs and metric points a case is made of."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from aiops_harness.agent_evals.generate.model import (
    CHAT,
    EBPF_BOUNDS,
    ECHO,
    EMBED,
    ERROR,
    HISTORY_S,
    INFO,
    MS,
    NS,
    OTEL_BOUNDS,
    SDK,
    WARN,
    Model,
)
from aiops_harness.agent_evals.generate.topology import (
    Deployment,
    Fault,
    Replica,
    Req,
    hex_id,
    parse_time,
    replica_id,
    to_ns,
    to_us,
)


class World:
    """Collects the rows of one case; ``now`` is when the question is asked."""

    def __init__(self, name: str, now: str, history_s: int = HISTORY_S) -> None:
        self.name = name
        self.rng = random.Random(name)
        self.now = parse_time(now)
        self.now_ns = to_ns(self.now)
        self.start_ns = self.now_ns - history_s * NS
        self.spans: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.deployments: dict[tuple[str, str], Deployment] = {}
        self.ingress_id = replica_id(self.rng)
        self.ingress_pid = self.rng.randint(3000, 9000)
        self.ingress_resource = {
            "service.name": "ingress", "service.version": "0.3.0",
            "service.instance.id": self.ingress_id, "ray.serve.app": "aiops",
            "ray.serve.deployment": "ingress", "ray.serve.replica": self.ingress_id, **SDK}
        self.requests: list[Req] = []
        self._next_pid = self.ingress_pid + 40
        self._observed: dict[tuple[str, str], list[tuple[int, float, Req]]] = {}
        self.ebpf_on = False
        self._cycle0 = self.start_ns
        self._every = 5 * NS

    def at(self, seconds_before_now: float) -> int:
        return self.now_ns - int(seconds_before_now * NS)

    def deploy(self, model: Model, version: str, replicas: int = 1,
               since_s: float | None = None) -> Deployment:
        up = self.start_ns - 3600 * NS if since_s is None else self.at(since_s)
        dep = Deployment(model, version, [self.new_replica(up) for _ in range(replicas)])
        self.deployments[(model.name, version)] = dep
        return dep

    def new_replica(self, up_ns: int) -> Replica:
        self._next_pid += self.rng.randint(7, 90)
        return Replica(replica_id(self.rng), self._next_pid, up_ns)

    def restart(self, dep: Deployment, replica: Replica, at_ns: int, downtime_s: float
                ) -> Replica:
        """The process exits at ``at_ns``; Serve starts a new replica (new id) after it."""
        replica.down_ns = at_ns
        fresh = self.new_replica(at_ns + int(downtime_s * NS))
        dep.replicas.append(fresh)
        return fresh

    # -- traffic -----------------------------------------------------------------------------

    def traffic(self, deps: Sequence[Deployment], rps: float | Callable[[int], float],
                weights: Callable[[int], Sequence[float]] | Sequence[float] | None = None,
                faults: Sequence[Fault] = (), start_s: float | None = None,
                end_s: float = 0.0, stream: float = 0.0, queue: bool = False,
                slowdown_per_busy: float = 0.0) -> list[Req]:
        """Requests to one model (its versions ``deps``), Poisson arrivals at ``rps``."""
        rng = self.rng
        model = deps[0].model
        t = self.start_ns if start_s is None else self.at(start_s)
        end = self.at(end_s)
        out: list[Req] = []
        while True:
            rate = rps(t) if callable(rps) else rps
            t = to_us(t + rng.expovariate(rate) * NS)
            if t >= end:
                break
            w = weights(t) if callable(weights) else (weights or [1.0] * len(deps))
            alive = [(d, x) for d, x in zip(deps, w, strict=True) if x > 0]
            dep = rng.choices([d for d, _ in alive], [x for _, x in alive])[0]
            req = self._base(model, t, rng.random() < stream)
            req.dep = dep
            req.replica, wait = self._route(dep, t)
            req.queue_ms += wait
            out.append(req)
        if queue:
            self._queue(out, slowdown_per_busy)
        for req in out:
            for fault in faults:
                fault(req, rng)
        self.requests += out
        return out

    def _route(self, dep: Deployment, t: int) -> tuple[Replica, float]:
        alive = [r for r in dep.replicas if r.alive(t)]
        if alive:
            return self.rng.choice(alive), 0.0
        coming = min((r for r in dep.replicas if r.up_ns > t), key=lambda r: r.up_ns)
        return coming, (coming.up_ns - t) / MS  # waits for the replacement replica

    def _base(self, model: Model, t: int, stream: bool) -> Req:
        rng = self.rng
        if model is CHAT:
            tin = rng.randint(14, 220)
            tout = max(4, min(150, int(rng.lognormvariate(math.log(48), 0.55))))
            ttft = 25 + tin * 1.1 * rng.uniform(0.9, 1.1)
            ms = ttft + (tout - 1) * 19 * rng.uniform(0.92, 1.08)
            finish = "length" if tout == 150 else "stop"
            return Req(t, None, None, tin, tout, ms, ttft, stream=stream, finish=finish)
        if model is ECHO:
            tin = rng.randint(3, 40)
            return Req(t, None, None, tin, tin, rng.uniform(0.3, 1.6), 0.2, stream=stream)
        if model is EMBED:
            texts = rng.choice([1, 1, 1, 1, 1, 2, 2, 3, 4])
            tin = sum(rng.randint(8, 48) for _ in range(texts))
            return Req(t, None, None, tin, 0, 4.0 + tin * 0.07 * rng.uniform(0.85, 1.2))
        tin = rng.randint(8, 30)  # OCR: prompt tokens; output: recognised text
        return Req(t, None, None, tin, rng.randint(10, 120), rng.gauss(520, 90))

    def _queue(self, reqs: list[Req], slowdown_per_busy: float) -> None:
        """The admission gate: ``max_ongoing`` per replica run at once, the rest wait (429
        beyond ``max_queue``); busy slots share the replica's CPU."""
        by_dep: dict[str, list[Req]] = {}
        for r in reqs:
            assert r.dep is not None
            by_dep.setdefault(r.dep.name, []).append(r)
        for group in by_dep.values():
            dep = group[0].dep
            assert dep is not None
            slots = [0] * (dep.model.max_ongoing * len([x for x in dep.replicas
                                                        if x.down_ns is None]))
            waiting: list[int] = []  # start times of queued requests
            for r in sorted(group, key=lambda r: r.t):
                arrival = r.t + int(r.queue_ms * MS)
                waiting = [s for s in waiting if s > arrival]
                free = heapq.heappop(slots)
                start = max(arrival, free)
                if start > arrival and len(waiting) >= dep.model.max_queue:
                    heapq.heappush(slots, free)
                    r.status, r.refusal = 429, (  # serve.admission.QueueFull
                        f"the {dep.model.priority} queue is full ({len(waiting)} waiting); "
                        "retry later")
                    continue
                busy = sum(1 for s in slots if s > start)
                r.model_ms *= 1 + slowdown_per_busy * busy
                r.queue_ms += (start - arrival) / MS
                if start > arrival:
                    waiting.append(start)
                heapq.heappush(slots, start + int(r.model_ms * MS))

    def refused(self, model: Model | None, t: int, status: int, message: str,
                dep: Deployment | None = None, route: str | None = None) -> Req:
        req = Req(to_us(t), dep, None, 0, 0, 0.0, status=status, refusal=message,
                  route=route or (model.route if model else "/v1/chat/completions"))
        self.requests.append(req)
        return req

    # -- emission ------------------------------------------------------------------------------

    def emit(self) -> None:
        for req in sorted(self.requests, key=lambda r: r.t):
            self._emit(req)
        # What has not ended by "now" has not been exported yet.
        self.spans = [s for s in self.spans if s["end_time"] <= self.now_ns]
        self.logs = [r for r in self.logs if r["time"] <= self.now_ns]
        self.points = [p for p in self.points if p["time"] <= self.now_ns]

    def _emit(self, req: Req) -> None:
        rng = self.rng
        dep = req.dep
        model = dep.model if dep else None
        route = req.route or (model.route if model else "/v1/chat/completions")
        trace_id, ingress_span, inference_id = hex_id(rng, 128), hex_id(rng, 64), hex_id(rng, 128)
        pre = rng.uniform(1.5, 4.0) * MS
        post = rng.uniform(0.8, 2.5) * MS
        attrs: dict[str, Any] = {"http.request.method": "POST", "http.route": route,
                                 "inference_id": inference_id}
        labels = dep.labels() if dep else {}
        attrs |= labels
        status, message = req.status, req.refusal
        if req.refusal is not None or dep is None or req.replica is None:
            total = pre + rng.uniform(0.2, 1.5) * MS + req.queue_ms * MS
        else:
            start = to_us(req.t + pre + req.queue_ms * MS)
            model_ns = to_us(req.model_ms * MS)
            if req.lost is not None:
                status, message = 500, req.lost
                model_ns = to_us(model_ns * rng.uniform(0.1, 0.9))
            else:
                self._model_span(req, dep, trace_id, ingress_span, inference_id, start, model_ns)
                if req.error is not None:
                    status = 500
                    message = (f"RayTaskError(ModelError)(ModelError('{req.error}'))"
                               if not req.stream else
                               "the model failed while streaming: RayTaskError(ModelError)")
            total = pre + req.queue_ms * MS + model_ns + post + req.net_ms * MS
        end = to_us(req.t + total)
        attrs["http.response.status_code"] = status
        self.spans.append({
            "trace_id": trace_id, "span_id": ingress_span, "name": f"POST {route}",
            "kind": "server", "start_time": req.t, "end_time": end, "duration_ns": end - req.t,
            "status_code": "error" if status >= 500 else "unset",
            "status_message": (message or str(status)) if status >= 500 else None,
            "service_name": "ingress", "resource_attributes": self.ingress_resource,
            "scope_name": "aiops.serve", "attributes": attrs, "dropped_attributes_count": 0})
        if status >= 400:
            self.logs.append({
                "time": end, "observed_time": end, "trace_id": trace_id, "span_id": ingress_span,
                "severity_number": WARN[0], "severity_text": WARN[1],
                "body": f"{route} answered {status}: {message}", "service_name": "ingress",
                "resource_attributes": self.ingress_resource,
                "scope_name": "aiops.serve.ingress", "flags": 1,
                "attributes": {"inference_id": inference_id, "http.status": status, **labels,
                               "code.function": "_finish", "code.lineno": 209,
                               "code.filepath": "/opt/aiops/serve/ingress.py"}})

    def _model_span(self, req: Req, dep: Deployment, trace_id: str, parent: str,
                    inference_id: str, start: int, dur: int) -> None:
        model, replica = dep.model, req.replica
        assert replica is not None
        span_id = hex_id(self.rng, 64)
        end = start + dur
        attrs: dict[str, Any] = {"gen_ai.operation.name": model.operation,
                                 "gen_ai.system": model.backend, "inference_id": inference_id,
                                 **dep.labels()}
        if req.stream:
            attrs["gen_ai.request.stream"] = True
        if req.prompt is not None:
            attrs["gen_ai.prompt"] = req.prompt
        resource = dep.resource(replica)
        log_attrs = {"inference_id": inference_id, **dep.labels(),
                     "code.filepath": "/opt/aiops/serve/replica.py"}
        row: dict[str, Any] = {
            "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent,
            "name": f"{model.operation} {model.name}", "kind": "internal", "start_time": start,
            "end_time": end, "duration_ns": dur, "status_code": "unset",
            "service_name": model.name, "resource_attributes": resource,
            "scope_name": "aiops.serve", "attributes": attrs, "dropped_attributes_count": 0}
        if req.error is not None:
            row |= {"status_code": "error", "status_message": req.error, "events": [{
                "time": end, "name": "exception", "attributes": {
                    "exception.type": "aiops.errors.ModelError",
                    "exception.message": req.error, "exception.escaped": "False"}}]}
            body, sev = f"inference failed: {req.error}", ERROR
            log_attrs |= {"code.function": "_fail", "code.lineno": 177}
        else:
            attrs |= {"gen_ai.response.model": model.name,
                      "gen_ai.usage.input_tokens": req.tokens_in,
                      "gen_ai.usage.output_tokens": req.tokens_out,
                      "gen_ai.response.finish_reasons": [req.finish]}
            body = (f"{model.model_type} in {dur / NS:.3f} s: {req.tokens_in} input tokens, "
                    f"{req.tokens_out} output tokens, {req.finish}")
            sev = INFO
            log_attrs |= {"code.function": "_succeed", "code.lineno": 208}
            self._observed.setdefault((dep.name, replica.id), []).append(
                (end, dur / NS, req))
        self.spans.append(row)
        self.logs.append({
            "time": end, "observed_time": end, "trace_id": trace_id, "span_id": span_id,
            "severity_number": sev[0], "severity_text": sev[1], "body": body,
            "service_name": model.name, "resource_attributes": resource,
            "scope_name": "aiops.serve.model", "flags": 1, "attributes": log_attrs})

    def log(self, t: int, body: str, severity: tuple[int, str] = INFO,
            service: str = "serve-control", version: str = "0.1.0",
            scope: str = "serve.control", attributes: dict[str, Any] | None = None) -> None:
        """A log record of a component other than the request path (the control plane)."""
        resource = {"service.name": service, "service.version": version, **SDK}
        self.logs.append({
            "time": t, "observed_time": t, "severity_number": severity[0],
            "severity_text": severity[1], "body": body, "service_name": service,
            "resource_attributes": resource, "scope_name": scope, "flags": 0,
            "attributes": attributes or {}})

    # -- metrics -----------------------------------------------------------------------------

    def replica_metrics(self, every_s: int = 10) -> None:
        """Cumulative request-duration histograms per replica (and time per output token
        for streamed requests), as the OTel SDK exports them."""
        for dep in self.deployments.values():
            for r in dep.replicas:
                seen = sorted(self._observed.get((dep.name, r.id), []), key=lambda x: x[0])
                streamed = [(t, (q.model_ms - q.ttft_ms) / 1000 / max(q.tokens_out - 1, 1))
                            for t, _, q in seen if q.stream and q.tokens_out > 1]
                series = [("gen_ai.server.request.duration", "Time the model replica spent "
                           "on a request", [(t, v) for t, v, _ in seen])]
                if streamed:
                    series.append(("gen_ai.server.time_per_output_token", "Mean time "
                                   "between streamed tokens after the first", streamed))
                for name, description, values in series:
                    self._cumulative(dep, r, name, description, values, every_s)

    def _cumulative(self, dep: Deployment, r: Replica, name: str, description: str,
                    values: list[tuple[int, float]], every_s: int) -> None:
        start = max(r.up_ns, self.start_ns - 30 * NS)
        stop = min(r.down_ns or self.now_ns, self.now_ns)
        first = start + (self.rng.randint(1, every_s * 1000) * MS)
        counts = [0] * (len(OTEL_BOUNDS) + 1)
        n, total, lo, hi, i = 0, 0.0, math.inf, -math.inf, 0
        tick = first
        while tick <= stop:
            while i < len(values) and values[i][0] <= tick:
                v = values[i][1]
                n, total, lo, hi = n + 1, total + v, min(lo, v), max(hi, v)
                counts[_bucket(v, OTEL_BOUNDS)] += 1
                i += 1
            if n and tick >= self.start_ns:
                self.points.append({
                    "time": tick, "start_time": r.up_ns, "name": name,
                    "description": description, "unit": "s", "type": "histogram",
                    "temporality": "cumulative", "count": n, "sum": round(total, 6),
                    "min": round(lo, 6), "max": round(hi, 6), "bucket_counts": list(counts),
                    "explicit_bounds": OTEL_BOUNDS, "service_name": dep.model.name,
                    "resource_attributes": dep.resource(r), "scope_name": "aiops.serve",
                    "attributes": dep.labels()})
            tick += every_s * NS

    def gauge(self, t: int, name: str, value: float, attributes: dict[str, Any],
              service: str, resource: dict[str, Any], scope: str, unit: str,
              description: str) -> None:
        self.points.append({
            "time": t, "name": name, "description": description, "unit": unit,
            "type": "gauge", "value": value, "service_name": service,
            "resource_attributes": resource, "scope_name": scope, "attributes": attributes})

    def rss(self, dep: Deployment, r: Replica, mb: Callable[[int], float | None],
            every_s: int = 10) -> None:
        """Ray's per-worker RSS gauge, as the Prometheus scraper stores it."""
        resource = {"service.name": "ray", "scrape.url": "http://127.0.0.1:8080/metrics"}
        t = self.start_ns + self.rng.randint(0, every_s * 1000) * MS
        while t <= self.now_ns:
            v = mb(t)
            if v is not None:
                self.gauge(t, "ray_component_rss_mb", round(v, 1), {
                    "Component": f"ray::ServeReplica:{dep.name}:{dep.name}",
                    "NodeAddress": "10.0.0.12", "SessionName": "session_2026-11-01_06-00-04",
                    "pid": str(r.pid)}, "ray", resource, "aiops.prometheus", "",
                    "RSS usage of all components on the node.")
            t += every_s * NS

    # -- eBPF (collectors/ebpf) ------------------------------------------------------------------

    def ebpf(self, runq: Callable[[Deployment | None, Replica | None, int], float],
             every_s: int = 5) -> None:
        """Run-queue histograms of every replica process (and the ingress) per cycle:
        ``runq`` gives the mean wait in microseconds at a time."""
        self.ebpf_on = True
        self._cycle0 = self.start_ns + self.rng.randint(0, every_s * 1000) * MS
        self._every = every_s * NS
        t = self._cycle0
        procs: list[tuple[Deployment | None, Replica | None]] = [(None, None)]
        procs += [(d, r) for d in self.deployments.values() for r in d.replicas]
        while t <= self.now_ns:
            for dep, r in procs:
                if r is not None and not (r.up_ns - 2 * NS <= t - self._every
                                          and (r.down_ns is None or t <= r.down_ns)):
                    continue
                mean_us = runq(dep, r, t)
                wakeups = int(self.rng.uniform(2500, 4000) if dep else
                              self.rng.uniform(800, 1400))
                self._runq_point(t, dep, r, wakeups, mean_us)
            t += self._every

    def _runq_point(self, t: int, dep: Deployment | None, r: Replica | None, count: int,
                    mean_us: float) -> None:
        slots = [0] * 24
        center = max(0, min(22, int(math.log2(max(mean_us, 1.0)))))
        for offset, share in ((-3, 0.04), (-2, 0.12), (-1, 0.3), (0, 0.32), (1, 0.16),
                              (2, 0.05), (3, 0.01)):
            k = max(0, min(23, center + offset))
            slots[k] += int(count * share * self.rng.uniform(0.85, 1.15))
        count = sum(slots)
        if dep is not None and r is not None:
            attrs = dep.process(r)
        else:
            attrs = {"process.pid": self.ingress_pid, "process.command": "ray::ServeRepli",
                     "ray.serve.app": "aiops", "ray.serve.deployment": "ingress",
                     "ray.serve.replica": self.ingress_id}
        self.points.append({
            "time": t, "start_time": t - self._every, "name": "aiops.ebpf.runq.latency",
            "unit": "s", "type": "histogram", "temporality": "delta", "count": count,
            "sum": round(count * mean_us * self.rng.uniform(0.9, 1.1) / 1e6, 6),
            "bucket_counts": slots, "explicit_bounds": EBPF_BOUNDS,
            **self._ebpf_resource(), "attributes": attrs})

    def _ebpf_resource(self) -> dict[str, Any]:
        return {"service_name": "aiops-ebpf", "scope_name": "aiops.collectors.ebpf",
                "resource_attributes": {"service.name": "aiops-ebpf", "host.name": "node-1"}}

    def ebpf_event(self, name: str, at_ns: int, attributes: dict[str, Any],
                   value: float = 1.0) -> None:
        """A counter point (exits, OOM kills, retransmits) in the cycle that saw the event."""
        assert self.ebpf_on, "call ebpf() first"
        k = -((self._cycle0 - at_ns) // self._every)  # the first cycle end >= at_ns
        t = self._cycle0 + k * self._every
        if t > self.now_ns:
            return
        for p in self.points:  # one point per attribute set and cycle
            if p["time"] == t and p["name"] == name and p["attributes"] == attributes:
                p["value"] += value
                return
        self.points.append({
            "time": t, "start_time": t - self._every, "name": name, "unit": "{event}",
            "type": "sum", "temporality": "delta", "is_monotonic": True, "value": value,
            **self._ebpf_resource(), "attributes": attributes})

    def exit(self, dep: Deployment, r: Replica, at_ns: int, oom: bool = False) -> None:
        attrs = dep.process(r)
        if oom:
            self.ebpf_event("aiops.ebpf.oom.kills", at_ns, attrs)
        self.ebpf_event("aiops.ebpf.process.exits", at_ns, attrs)


def _bucket(v: float, bounds: Sequence[float]) -> int:
    for i, b in enumerate(bounds):
        if v <= b:
            return i
    return len(bounds)


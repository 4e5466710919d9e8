"""The demo's report: Markdown with the story of each incident, a plot of the clients' SLIs
with the fault, detection, action and recovery marked on it, and the raw figures as JSON."""

from __future__ import annotations

import json
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops_harness.demo.traffic import Sample, Traffic

if TYPE_CHECKING:
    from aiops_harness.demo.runner import ScenarioResult

__all__ = ["mark_events", "write_report"]

BUCKET_S = 2.0


def _series(samples: list[Sample], t0: float) -> dict[str, list[tuple[float, float, float]]]:
    """Per model@version: (seconds since t0, p95 latency ms, failed share) per bucket."""
    buckets: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for s in samples:
        key = f"{s.model}@{s.version}" if s.version else s.model
        buckets[(key, int((s.end - t0) // BUCKET_S))].append(s)
    out: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for (key, b), xs in sorted(buckets.items(), key=lambda kv: kv[0][1]):
        lat = sorted(x.seconds * 1000 for x in xs)
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        out[key].append((b * BUCKET_S, p95, sum(x.status != 200 for x in xs) / len(xs)))
    return out


def _plot(results: list[ScenarioResult], samples: list[Sample], t0: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.6 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        s = r.scenario
        lo, hi = r.fault_at - 25, (r.resolved_at or r.fault_at + 90) + 20
        window = [x for x in samples if lo <= x.end <= hi and x.model == r.model]
        for key, points in _series(window, t0).items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=key)
        ax.set_yscale("log")
        ax.set_ylabel("p95 latency, ms (client)")
        ax2 = ax.twinx()
        for key, points in _series(window, t0).items():
            ax2.bar([p[0] for p in points], [p[2] for p in points], width=BUCKET_S * 0.8,
                    alpha=0.25, label=f"{key} failed share")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("failed share")
        mark_events(ax, r.events, t0)
        # Above the event numbers (up to three rows of them).
        ax.set_title(f"{s.name}: {s.title}", loc="left", pad=34)
        ax.set_xlabel("seconds since the demo started")
        if window:  # a model without client traffic (the agent's) has no series to label
            ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def mark_events(ax: Any, events: list[tuple[float, str]], t0: float) -> list[Any]:
    """A dashed line per event, numbered above the plot (numbers of events close together
    stacked, not drawn over each other), and the numbered labels in a caption under it:
    detection, action and recovery often come within a second of each other. Returns the
    text artists."""
    texts = []
    events = sorted(events)
    left, right = ax.get_xlim()
    span = max(right - left, 1e-9)
    lanes: list[float] = []  # the x of the last number in each row
    for i, (at, _) in enumerate(events, 1):
        x = at - t0
        ax.axvline(x, color="black", linestyle="--", linewidth=0.8)
        row = next((k for k, last in enumerate(lanes) if (x - last) / span > 0.03),
                   len(lanes))
        lanes[row:row + 1] = [x]
        texts.append(ax.annotate(str(i), (x, 1), xycoords=("data", "axes fraction"),
                                 xytext=(0, 2 + 10 * row), textcoords="offset points",
                                 ha="center", va="bottom", fontsize=7))
    caption = "   ".join(f"{i} {label} (+{at - events[0][0]:.1f} s)"
                           for i, (at, label) in enumerate(events, 1))
    if caption:
        texts.append(ax.text(0, -0.3, textwrap.fill(caption, 150), transform=ax.transAxes,
                             fontsize=7, va="top", ha="left"))
    return texts


def _fmt(v: float | None) -> str:
    return f"{v:.1f}" if v is not None else "-"


def write_report(results: list[ScenarioResult], traffic: Traffic, root: Path,
                 t0: float) -> list[Path]:
    """``<root>/<UTC time>/report.md``, ``slis.png``, ``report.json``; the paths."""
    folder = root / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t0))
    folder.mkdir(parents=True, exist_ok=True)
    samples = list(traffic.samples)
    png = folder / "slis.png"
    if results:
        _plot(results, samples, t0, png)
    lines = ["# aiops demo report", "",
             f"Started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t0))}; "
             f"{len(samples)} requests (chat, streaming chat, embeddings, images).", "",
             "| scenario | incident | attributed to | action | MTTD s | time to recovered s |",
             "|---|---|---|---|---|---|"]
    for r in results:
        inc = r.incident or {}
        act = f"{r.action['kind']} ({r.action['status']})" if r.action else \
            ("operator fix" if r.fixed_at else "-")
        lines.append(f"| {r.scenario.name} | `{inc.get('incident_id', '-')}` | "
                     f"{inc.get('fault_class')} on {inc.get('service')}@"
                     f"{inc.get('model_version')} | {act} | {_fmt(r.mttd_s)} | "
                     f"{_fmt(r.ttr_s)} |")
    lines += ["", "![SLIs as the clients saw them, with the fault, detection, action and "
              "recovery marked](slis.png)", ""]
    for r in results:
        s = r.scenario
        lines += [f"## {s.name}: {s.title}", "",
                  (f"Lost Ray node {s.lose_node}; it ran {r.model} {r.version}"
                   if s.lose_node else
                   f"Injected on {s.model} {s.version}: `{json.dumps(s.faults)}`")
                  + (f" (a canary on {s.canary_percent}% of traffic)"
                     if s.canary_percent is not None else "") + ".", ""]
        lines += [f"- {time.strftime('%H:%M:%S', time.gmtime(at))} (+{at - r.fault_at:.1f} s) "
                  f"{label}" for at, label in sorted(r.events)]
        if r.incident:
            causes = r.incident["evidence"].get("root_causes", [])
            for c in causes[:2]:
                ids = ", ".join(f"{e['kind']} `{e['id']}`" for e in c["evidence"][:4])
                lines.append(f"- root cause: {c['fault_class']} on {c['entity']} (confidence "
                             f"{c['confidence']:.0%}); evidence: {ids}")
        if r.action:
            lines.append(f"- action `{r.action['action_id']}`: {r.action['kind']} "
                         f"{r.action['target']}, policy mode {r.action['mode']}, "
                         f"{r.action['status']}")
        if r.answer:
            lines += ["", "**Chat-ops: what happened?**", "", r.answer["text"]]
        lines += [f"- note: {n}" for n in s.notes + r.problems]
        lines.append("")
    md = folder / "report.md"
    md.write_text("\n".join(lines))
    data = folder / "report.json"
    data.write_text(json.dumps([_result_json(r) for r in results], indent=2, default=str))
    return [md, png, data]


def _result_json(r: ScenarioResult) -> dict[str, Any]:
    return {"scenario": r.scenario.name, "model": r.model,
            "version": r.version, "faults": r.scenario.faults,
            "lost_node": r.scenario.lose_node,
            "fault_at": r.fault_at, "detected_at": r.detected_at, "acted_at": r.acted_at,
            "fixed_at": r.fixed_at, "resolved_at": r.resolved_at,
            "recovered_at": r.recovered_at, "mttd_s": r.mttd_s, "ttr_s": r.ttr_s,
            "attributed": r.attributed, "incident": r.incident, "action": r.action,
            "answer": r.answer, "events": r.events, "problems": r.problems}

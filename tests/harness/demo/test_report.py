"""The demo report's plot: events that come within a second of each other (detected, acted,
recovered) stay readable, their marks never drawn over each other."""

from __future__ import annotations

import itertools

import matplotlib

from aiops_harness.demo.report import mark_events

matplotlib.use("Agg")


def test_close_events_are_marked_without_overlapping_labels() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.plot([0, 120], [100, 200])
    t0 = 1000.0
    events = [(t0 + 30.0, "fault injected"), (t0 + 33.1, "detected: incident inc-1 (page)"),
              (t0 + 33.4, "rollback executed 3.4 s after the fault"),
              (t0 + 33.6, "clients' last bad request"), (t0 + 48.0, "verified")]
    texts = mark_events(ax, events, t0)
    fig.tight_layout()
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in texts]
    assert len(texts) == len(events) + 1  # a number per event, and the caption
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    caption = texts[-1].get_text()
    assert "2 detected" in caption and "+3.1 s" in caption
    plt.close(fig)

"""Leave-one-category-out (LOCO) over NAB's data families: which metric detector, with which
parameters and threshold, generalises to a family it was not chosen on.

Candidates are {method} x {a small parameter grid} x {quiet period}
(``aiops.analytics.metric_live``). Each method runs once over all 58 series (raw scores are
cached per file; quiet periods and thresholds are applied afterwards, exactly as the live
``Quieted`` rule does), and every file is scored at every threshold of ``THRESHOLDS``: NAB's
standard-profile raw score and the event counts of ``aiops_harness.evals.nab_events``.

For each held-out category (a folder of NAB's ``data/``), the candidate and its threshold are
chosen on the other six categories alone, by NAB standard score (the summed raw score of their
files: the same argmax as their normalised score). The held-out category is then scored: its
NAB standard score (normalised over its files) and its event-level F1. Beside each:

* the windowed-Gaussian baseline (NAB's detector and parameters, no quiet period), its threshold
  chosen on the same six categories;
* a sweep range: the min-max of the held-out figure over every candidate of the grid (each at
  its own threshold chosen on the six); for the baseline, over the windowed-Gaussian family;
* the "oracle" event-F1 at the held-out category's own best threshold (optimistic by
  construction).

``artificialNoAnomaly`` has no windows: as a held-out fold it has no NAB normalisation and no F1,
so its false-positive alarms are reported instead; it does take part in every training set.

The candidate and threshold chosen the same way on all seven categories is
``NAB_STANDARD_CHOICE`` (the live default until 2026-12-06). The live default
(``LIVE_DEFAULT`` in ``aiops.analytics.metric_live``) is now chosen by event F0.5 on NAB and
cloud_kpi together (``aiops_harness.evals.detector_choice``): selection by NAB standard score did
not
transfer to the second corpus (``aiops_harness.evals.detector_transfer``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from aiops.analytics.metric_live import LiveDefault, MethodSpec, spike_score
from aiops_harness.datasets import DATASETS
from aiops_harness.evals.nab import data_files, detect_all, load_profiles, load_windows, read_series
from aiops_harness.evals.nab_events import EventCounts, FileTable, file_table
from aiops_harness.evals.nab_score import FloatArray, normalized

__all__ = [
    "BASELINE",
    "NAB_STANDARD_CHOICE",
    "QUIETS",
    "SPECS",
    "THRESHOLDS",
    "Candidate",
    "Choice",
    "Fold",
    "HeldOut",
    "LocoReport",
    "choose",
    "held_out",
    "loco",
    "raw_scores",
    "render_loco",
    "run_loco",
    "tables_for",
]

# Thresholds 1 - 10**-k: finely where CAD-like scores live (0.5-0.999), coarser in the far
# tails where Gaussian scores live (k = 9 is |z| near 6, k = 15.5 near 8), and exactly 1.0
# (a tail beyond double precision: |z| > 8.3).
THRESHOLDS: tuple[float, ...] = tuple(sorted(
    {1.0 - 10.0 ** -float(k) for k in np.r_[np.arange(0.1, 3.0, 0.025), np.arange(3.0, 9.0, 0.1),
                                      np.arange(9.0, 15.6, 0.25)]} | {1.0}))

SPECS: tuple[MethodSpec, ...] = (
    MethodSpec("cad"),
    MethodSpec("gaussian", (("window", 6400), ("step", 100))),   # NAB's windowedGaussian
    MethodSpec("gaussian", (("window", 1000), ("step", 10))),
    MethodSpec("gaussian", (("window", 288), ("step", 1))),
    MethodSpec("robust", (("window", 288), ("step", 1))),
    MethodSpec("robust", (("window", 2000), ("step", 10))),
    MethodSpec("seasonal_gaussian", (("window", 6400), ("step", 100))),
    MethodSpec("seasonal_robust", (("window", 2000), ("step", 10))),
    MethodSpec("cad_spike", (("z", 10), ("window", 288), ("step", 1))),
    MethodSpec("cad_spike", (("z", 30), ("window", 288), ("step", 1))),
)
QUIETS: tuple[int, ...] = (0, 20, 100)


@dataclass(frozen=True)
class Candidate:
    """A method with its parameters, and the quiet period of its alerting rule."""

    spec: MethodSpec
    quiet: int

    @property
    def key(self) -> str:
        return f"{self.spec.key} quiet={self.quiet}"


BASELINE = Candidate(SPECS[1], 0)  # NAB's windowedGaussian exactly as NAB runs it

# What ``run_loco`` chooses on all 58 files of NAB v1.1's seven categories by NAB standard score
# (1 - 10**-0.65 on ``THRESHOLDS``); CAD also won each of the six scored leave-one-category-out
# folds. It was the live default until 2026-12-06, when event-F1 selection on NAB and
# cloud_kpi together replaced it (``aiops_harness.evals.detector_choice``).
NAB_STANDARD_CHOICE = LiveDefault(
    spec=MethodSpec("cad"),
    threshold=0.776127886143166,
    quiet=20,
    chosen_on="NAB v1.1, all 7 categories (58 files), NAB standard profile",
)


# -- raw scores and per-file tables ---------------------------------------------------------

# Bump a method's version when its scores change.
_CACHE_VERSIONS = {"cad": 1, "gaussian": 1, "robust": 2, "seasonal_gaussian": 1,
                   "seasonal_robust": 2}


Loader = Callable[[str], tuple[npt.NDArray[np.datetime64], FloatArray]]


def raw_scores(root: Path, spec: MethodSpec, rels: Sequence[str],
               cache_dir: Path | None = None,
               memo: dict[str, dict[str, FloatArray]] | None = None,
               load: Loader | None = None, corpus: str = "nab") -> dict[str, FloatArray]:
    """Every file streamed through a fresh ``spec.build()`` (no look-ahead); kept in ``memo``
    and cached on disk under ``cache_dir`` when given (keyed by ``corpus``, the method, the
    files and ``_CACHE_VERSIONS``). ``load`` reads a series (timestamps, values) by its name
    in ``rels``; by default NAB's ``root/data/<rel>``."""
    memo = {} if memo is None else memo
    if spec.key in memo:
        return memo[spec.key]
    if spec.method == "cad_spike":
        # Its two members share nothing, so their raw scores combine exactly (test_gaussian).
        params = dict(spec.params)
        cad = raw_scores(root, MethodSpec("cad"), rels, cache_dir, memo, load, corpus)
        member = MethodSpec("robust", (("window", params["window"]), ("step", params["step"])))
        robust = raw_scores(root, member, rels, cache_dir, memo, load, corpus)
        spike = np.vectorize(lambda r: spike_score(r, params["z"]), otypes=[np.float64])
        memo[spec.key] = {rel: np.maximum(cad[rel], spike(robust[rel])) for rel in rels}
        return memo[spec.key]
    path = None
    if cache_dir is not None:
        version = _CACHE_VERSIONS[spec.method]
        digest = hashlib.sha1(f"{version}|{spec.key}|{'|'.join(rels)}".encode())
        path = cache_dir / f"{corpus}-{spec.method}-{digest.hexdigest()[:12]}.npz"
        if path.exists():
            with np.load(path) as saved:
                memo[spec.key] = {rel: saved[f"f{i}"] for i, rel in enumerate(rels)}
                return memo[spec.key]
    series = {}
    for rel in rels:
        if load is not None:
            series[rel] = load(rel)
            continue
        data = read_series(root / "data" / rel)
        series[rel] = (data["timestamp"].astype("datetime64[ns]"),
                       data["value"].astype(np.float64))
    out = detect_all(series, spec.build)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {f"f{i}": out[rel] for i, rel in enumerate(rels)}
        np.savez_compressed(path, **arrays)
    memo[spec.key] = out
    return out


def tables_for(root: Path, candidates: Sequence[Candidate], cache_dir: Path | None = None,
               progress: Callable[[str], None] | None = None
               ) -> tuple[dict[str, dict[str, FileTable]], dict[str, str], dict[str, float]]:
    """Per candidate key, per file, its table over ``THRESHOLDS``; each file's category; and
    the seconds each method took to stream the corpus (0 when read from the cache)."""
    windows = load_windows(root)
    cost = load_profiles(root)["standard"]
    rels = [r for r in data_files(root) if r in windows]
    stamps = {r: read_series(root / "data" / r, ("timestamp",))["timestamp"].astype(
        "datetime64[ns]") for r in rels}
    tables: dict[str, dict[str, FileTable]] = {}
    seconds: dict[str, float] = {}
    by_spec: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_spec.setdefault(c.spec.key, []).append(c)
    memo: dict[str, dict[str, FloatArray]] = {}
    for group in by_spec.values():
        spec = group[0].spec
        started = time.perf_counter()
        scores = raw_scores(root, spec, rels, cache_dir, memo)
        seconds[spec.key] = time.perf_counter() - started
        if progress:
            progress(f"{spec.key}: {seconds[spec.key]:.1f} s")
        for c in group:
            tables[c.key] = {r: file_table(r, stamps[r], scores[r], windows[r], cost,
                                           THRESHOLDS, c.quiet) for r in rels}
    return tables, {r: r.split("/")[0] for r in rels}, seconds


# -- choosing and scoring -------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A candidate and threshold, and the files (categories) they were chosen on."""

    key: str
    threshold: float
    index: int                 # into THRESHOLDS
    train_raw: float           # summed NAB standard raw score on the training files
    categories: tuple[str, ...]
    files: int


def choose(tables: Mapping[str, Mapping[str, FileTable]], files: Sequence[str],
           categories: Sequence[str], thresholds: Sequence[float] = THRESHOLDS) -> Choice:
    """The candidate and threshold with the best summed NAB raw score over ``files`` (ties:
    the first candidate given, then the higher threshold: fewer alerts)."""
    best: Choice | None = None
    for key, table in tables.items():
        raw = np.sum([table[f].raw for f in files], axis=0)
        j = int(len(raw) - 1 - np.argmax(raw[::-1]))
        if best is None or raw[j] > best.train_raw:
            best = Choice(key, float(thresholds[j]), j, float(raw[j]),
                          tuple(sorted(categories)), len(files))
    if best is None:
        raise ValueError("no candidates")
    return best


@dataclass(frozen=True)
class HeldOut:
    """One candidate at one threshold on the held-out files."""

    nab: float | None          # NAB standard score normalised over these files (None: no windows)
    raw: float
    counts: EventCounts
    oracle_f1: float | None    # event-F1 at these files' own best threshold

    @property
    def f1(self) -> float | None:
        return self.counts.f1


def held_out(table: Mapping[str, FileTable], files: Sequence[str], index: int) -> HeldOut:
    rows = [table[f] for f in files]
    raw = float(sum(r.raw[index] for r in rows))
    windows = sum(r.labelled for r in rows)
    null = max(sum(r.null_none for r in rows), sum(r.null_all for r in rows))
    nab = normalized(raw, null, float(windows)) if windows else None  # tp weight 1: perfect
    counts = sum((r.counts[index] for r in rows), EventCounts())
    per_threshold = [sum((r.counts[j] for r in rows), EventCounts()).f1
                     for j in range(len(rows[0].counts))]
    f1s = [f for f in per_threshold if f is not None]
    return HeldOut(nab, raw, counts, max(f1s) if f1s else None)


@dataclass(frozen=True)
class Fold:
    held_out: str
    files: int
    windows: int
    chosen: Choice
    baseline: Choice
    ours: HeldOut
    base: HeldOut
    ours_range: dict[str, tuple[float, float]]   # figure -> (min, max) over the grid
    base_range: dict[str, tuple[float, float]]   # over the windowed-Gaussian family


def _ranges(results: Sequence[HeldOut]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, values in (("nab", [r.nab for r in results]), ("f1", [r.f1 for r in results]),
                         ("fp", [float(r.counts.fp) for r in results])):
        known = [v for v in values if v is not None]
        if known:
            out[name] = (min(known), max(known))
    return out


def loco(tables: Mapping[str, Mapping[str, FileTable]], category_of: Mapping[str, str],
         baseline: str, family: Sequence[str],
         thresholds: Sequence[float] = THRESHOLDS) -> list[Fold]:
    """One fold per category: choose on the others, score on it. ``baseline`` is the
    baseline's key, ``family`` the keys its sweep range runs over."""
    folds = []
    for category in sorted(set(category_of.values())):
        test = sorted(f for f, c in category_of.items() if c == category)
        train = sorted(f for f, c in category_of.items() if c != category)
        train_cats = sorted({category_of[f] for f in train})
        chosen = choose(tables, train, train_cats, thresholds)
        base = choose({baseline: tables[baseline]}, train, train_cats, thresholds)
        # Each candidate at its own threshold chosen on the training files, scored held out.
        own = {k: held_out(t, test, choose({k: t}, train, train_cats, thresholds).index)
               for k, t in tables.items()}
        folds.append(Fold(category, len(test), sum(tables[baseline][f].labelled for f in test),
                          chosen, base, held_out(tables[chosen.key], test, chosen.index),
                          held_out(tables[baseline], test, base.index), _ranges(list(own.values())),
                          _ranges([own[k] for k in family])))
    return folds


@dataclass(frozen=True)
class LocoReport:
    folds: list[Fold]
    live: Choice               # chosen on every category (``NAB_STANDARD_CHOICE``)
    live_all: HeldOut          # the live choice on all files (in-sample)
    baseline_all: HeldOut      # the baseline at its all-files threshold (in-sample)
    baseline_choice: Choice
    candidates: list[str]
    seconds: dict[str, float]


def run_loco(root: Path, specs: Sequence[MethodSpec] = SPECS,
             quiets: Sequence[int] = QUIETS, cache_dir: Path | None = None,
             progress: Callable[[str], None] | None = None) -> LocoReport:
    candidates = [Candidate(s, q) for s in specs for q in quiets]
    if BASELINE.key not in {c.key for c in candidates}:
        candidates.insert(0, BASELINE)
    tables, category_of, seconds = tables_for(root, candidates, cache_dir, progress)
    family = [c.key for c in candidates if c.spec.method == "gaussian"]
    folds = loco(tables, category_of, BASELINE.key, family)
    files = sorted(category_of)
    cats = sorted(set(category_of.values()))
    live = choose(tables, files, cats)
    base = choose({BASELINE.key: tables[BASELINE.key]}, files, cats)
    return LocoReport(folds, live, held_out(tables[live.key], files, live.index),
                      held_out(tables[BASELINE.key], files, base.index), base,
                      [c.key for c in candidates], seconds)


# -- the report -----------------------------------------------------------------------------


def _fig(value: float | None, rng: tuple[float, float] | None, fmt: str) -> str:
    if value is None:
        return "n/a"
    text = format(value, fmt)
    return f"{text} [{format(rng[0], fmt)}-{format(rng[1], fmt)}]" if rng else text


def render_loco(report: LocoReport) -> str:
    """Markdown: per held-out category, the chosen detector beside the windowed Gaussian."""
    lines = ["| Held out (files, windows) | Chosen on the other 6 (threshold) | NAB std: chosen "
             "[grid range] | NAB std: WG [WG range] | Event-F1: chosen [range] | Event-F1: WG "
             "[range] | Oracle F1 chosen / WG | FPs chosen / WG |",
             "|---|---|---|---|---|---|---|---|"]
    for f in report.folds:
        o, b = f.ours, f.base
        oracle = (f"{_fig(o.oracle_f1, None, '.2f')} / {_fig(b.oracle_f1, None, '.2f')}")
        lines.append(
            f"| {f.held_out} ({f.files}, {f.windows}) | {f.chosen.key} "
            f"({f.chosen.threshold:.6g}); WG ({f.baseline.threshold:.6g}) | "
            f"{_fig(o.nab, f.ours_range.get('nab'), '.1f')} | "
            f"{_fig(b.nab, f.base_range.get('nab'), '.1f')} | "
            f"{_fig(o.f1, f.ours_range.get('f1'), '.2f')} | "
            f"{_fig(b.f1, f.base_range.get('f1'), '.2f')} | {oracle} | "
            f"{_fig(o.counts.fp, f.ours_range.get('fp'), '.0f')} / "
            f"{_fig(b.counts.fp, f.base_range.get('fp'), '.0f')} |")
    live, la, ba = report.live, report.live_all, report.baseline_all
    lines += [
        "",
        f"Chosen on all {len(live.categories)} categories ({live.files} files) by NAB standard "
        f"score (the live default until 2026-12-06): {live.key}, threshold {live.threshold:.6g}; "
        f"in-sample NAB "
        f"standard {_fig(la.nab, None, '.1f')}, event-F1 {_fig(la.f1, None, '.2f')} "
        f"(windowed Gaussian at its all-files threshold {report.baseline_choice.threshold:.6g}: "
        f"{_fig(ba.nab, None, '.1f')}, {_fig(ba.f1, None, '.2f')}).",
        f"Grid: {len(report.candidates)} candidates x {len(THRESHOLDS)} thresholds; WG = NAB's "
        f"windowedGaussian (window 6400, step 100, no quiet period); ranges are min-max over the "
        "grid (WG: over its window/step/quiet family), each candidate at its threshold chosen "
        "on the training categories. Streaming seconds (0: read from the cache): "
        + ", ".join(f"{k} {s:.0f}" for k, s in report.seconds.items()) + ".",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else DATASETS / "nab"
    cache = Path(args[1]) if len(args) > 1 else None
    print(render_loco(run_loco(root, cache_dir=cache, progress=print)))


if __name__ == "__main__":
    main()

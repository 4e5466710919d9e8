"""Does the metric detector chosen on NAB transfer to a corpus it was never chosen on?

Candidates, thresholds, raw scores and the choosing rule are ``aiops_harness.evals.nab_loco``'s
(``SPECS`` x ``QUIETS``, ``THRESHOLDS``, the best summed NAB standard raw score, ties to the
first candidate and the higher threshold); events and false alarms are
``aiops_harness.evals.nab_events``'; the second corpus is ``aiops_harness.evals.cloud_kpi`` (six
KPI families).
Three views, each scored per cloud_kpi family by event-level F1 (precision, recall) and by
the false alarms on the family's quiet series (no labelled anomaly):

a. **NAB -> cloud_kpi**: the candidate and threshold chosen on all of NAB
   (``nab_loco.NAB_STANDARD_CHOICE``, the live default until 2026-12-06), beside NAB's windowed
   Gaussian (``nab_loco.BASELINE``) at its threshold chosen on all of NAB the same way (as
   NAB runs it: no quiet period), and the same Gaussian behind that choice's quiet period
   (``WG_QUIETED``), so that the alerting rule is not what separates them. Nothing of
   cloud_kpi is looked at.
b. **Leave one family out** inside cloud_kpi (``nab_loco.loco`` with families as categories):
   for each family, candidate and threshold chosen on the other five, the Gaussian's threshold
   likewise; brackets give the held-out F1's range over the grid (each candidate at its own
   threshold chosen on the five) and over the windowed-Gaussian family.
c. **References**: ``NAB_STANDARD_CHOICE`` at its frozen threshold (``FROZEN``), and,
   labelled oracle, each detector at the family's own best event-F1 threshold (optimistic by
   construction).

Pooled rows add the counts of every family (in b, each family at its own fold's choice).
Selection by event F1 with whole corpora held out, and the live default it chose:
``aiops_harness.evals.detector_choice``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiops.analytics.metric_live import MethodSpec
from aiops_harness.evals.cloud_kpi import KpiSeries, corpus_tables, load_corpus
from aiops_harness.evals.nab import load_profiles
from aiops_harness.evals.nab_events import EventCounts, FileTable
from aiops_harness.evals.nab_loco import (
    BASELINE,
    NAB_STANDARD_CHOICE,
    QUIETS,
    SPECS,
    THRESHOLDS,
    Candidate,
    Choice,
    choose,
    held_out,
    loco,
    tables_for,
)

__all__ = ["FROZEN", "WG_QUIETED", "FamilyResult", "Scored", "TransferReport", "oracle",
           "render", "run_transfer", "scored"]

# The choice on NAB by NAB standard score, as frozen (the live default until 2026-12-06).
FROZEN = Candidate(NAB_STANDARD_CHOICE.spec, NAB_STANDARD_CHOICE.quiet)
# NAB's windowed Gaussian behind that choice's alerting rule (its quiet period).
WG_QUIETED = Candidate(BASELINE.spec, NAB_STANDARD_CHOICE.quiet)


@dataclass(frozen=True)
class Scored:
    """One candidate at one threshold on some files."""

    key: str
    threshold: float
    counts: EventCounts
    quiet_fp: int              # detections on the quiet series among the files
    nab: float | None          # NAB standard, normalised over the files (None: no events)
    days: float = 0.0          # series-days the files' scored rows span
    quiet_days: float = 0.0    # ... of those, on the quiet series

    @property
    def fp_per_day(self) -> float | None:
        """False alarms per series-day, over all the files."""
        return self.counts.fp / self.days if self.days else None

    @property
    def quiet_fp_per_day(self) -> float | None:
        """False alarms per series-day on the series with no anomaly (None: none among them)."""
        return self.quiet_fp / self.quiet_days if self.quiet_days else None

    @property
    def f1(self) -> float | None:
        return self.counts.f1

    @property
    def precision(self) -> float | None:
        c = self.counts
        return c.tp / (c.tp + c.fp) if c.tp + c.fp else None

    @property
    def recall(self) -> float | None:
        c = self.counts
        return c.tp / (c.tp + c.fn) if c.tp + c.fn else None


def scored(tables: Mapping[str, Mapping[str, FileTable]], key: str, files: Sequence[str],
           index: int) -> Scored:
    table = tables[key]
    result = held_out(table, files, index)
    quiet = [f for f in files if table[f].labelled == 0]
    quiet_fp = sum(table[f].counts[index].fp for f in quiet)
    return Scored(key, THRESHOLDS[index], result.counts, quiet_fp, result.nab,
                  sum(table[f].days for f in files), sum(table[f].days for f in quiet))


def oracle(tables: Mapping[str, Mapping[str, FileTable]], key: str,
           files: Sequence[str]) -> Scored | None:
    """``key`` at the threshold with the best event-F1 on ``files`` themselves (ties: the
    higher threshold); None when the files have no event."""
    rows = [tables[key][f] for f in files]
    f1s = [sum((r.counts[j] for r in rows), EventCounts()).f1 for j in range(len(THRESHOLDS))]
    known = [(f, j) for j, f in enumerate(f1s) if f is not None]
    if not known:
        return None
    best = max(known)[1]
    return scored(tables, key, files, best)


def _f1_range(tables: Mapping[str, Mapping[str, FileTable]], keys: Sequence[str],
              files: Sequence[str], index: Mapping[str, int]) -> tuple[float, float] | None:
    f1s = [f for k in keys if (f := scored(tables, k, files, index[k]).f1) is not None]
    return (min(f1s), max(f1s)) if f1s else None


def _pool(results: Sequence[Scored]) -> Scored:
    counts = sum((r.counts for r in results), EventCounts())
    return Scored("pooled", float("nan"), counts, sum(r.quiet_fp for r in results), None,
                  sum(r.days for r in results), sum(r.quiet_days for r in results))


@dataclass(frozen=True)
class FamilyResult:
    family: str
    series: int
    quiet_series: int
    events: int                # labelled runs after the probation (scored)
    labelled: int              # labelled runs in all
    from_nab: Scored           # (a) chosen on NAB
    from_nab_wg: Scored
    from_nab_range: tuple[float, float] | None     # F1 over the grid, each at its NAB threshold
    from_nab_wg_range: tuple[float, float] | None  # ... over the windowed-Gaussian family
    from_nab_wg_quieted: Scored                    # WG_QUIETED at its threshold chosen on NAB
    lofo_choice: Choice        # (b) chosen on the other families
    lofo_wg_choice: Choice
    lofo: Scored
    lofo_wg: Scored
    lofo_range: tuple[float, float] | None      # held-out F1 over the grid
    lofo_wg_range: tuple[float, float] | None   # ... over the windowed-Gaussian family
    frozen: Scored             # (c) NAB_STANDARD_CHOICE as frozen
    frozen_oracle: Scored | None
    wg_oracle: Scored | None


@dataclass(frozen=True)
class TransferReport:
    families: list[FamilyResult]
    nab_choice: Choice         # on all of NAB
    nab_wg_choice: Choice
    pooled: dict[str, Scored]  # by FamilyResult field: "from_nab", "lofo", "frozen", ...
    candidates: list[str]
    series: int
    rows: int
    duplicates: int
    seconds: dict[str, float]


def run_transfer(nab_root: Path, kpi_root: Path, specs: Sequence[MethodSpec] = SPECS,
                 quiets: Sequence[int] = QUIETS, cache_dir: Path | None = None,
                 progress: Callable[[str], None] | None = None,
                 corpus: Mapping[str, KpiSeries] | None = None) -> TransferReport:
    """The three views over ``specs`` x ``quiets`` (plus the baseline and the frozen default
    when the grid lacks them); ``corpus`` is ``load_corpus(kpi_root)`` when not given."""
    candidates = [Candidate(s, q) for s in specs for q in quiets]
    for must in (WG_QUIETED, FROZEN, BASELINE):
        if must.key not in {c.key for c in candidates}:
            candidates.insert(0, must)
    series = dict(corpus) if corpus is not None else load_corpus(kpi_root)
    cost = load_profiles(nab_root)["standard"]
    # (a) on NAB alone.
    nab_tables, nab_category, nab_seconds = tables_for(nab_root, candidates, cache_dir, progress)
    nab_files, nab_cats = sorted(nab_category), sorted(set(nab_category.values()))
    nab_choice = choose(nab_tables, nab_files, nab_cats)
    nab_wg = choose({BASELINE.key: nab_tables[BASELINE.key]}, nab_files, nab_cats)
    nab_index = {k: choose({k: t}, nab_files, nab_cats).index for k, t in nab_tables.items()}
    del nab_tables
    # cloud_kpi.
    tables, seconds = corpus_tables(series, candidates, cost, cache_dir, progress)
    family_of = {rel: s.family for rel, s in series.items()}
    wg_family = [c.key for c in candidates if c.spec.method == "gaussian"]
    folds = {f.held_out: f for f in loco(tables, family_of, BASELINE.key, wg_family)}
    frozen_index = THRESHOLDS.index(NAB_STANDARD_CHOICE.threshold)
    results = []
    for family, fold in folds.items():
        files = sorted(r for r, f in family_of.items() if f == family)
        base = tables[BASELINE.key]
        results.append(FamilyResult(
            family, len(files), sum(series[f].quiet for f in files),
            sum(base[f].windows for f in files), sum(base[f].labelled for f in files),
            scored(tables, nab_choice.key, files, nab_choice.index),
            scored(tables, BASELINE.key, files, nab_wg.index),
            _f1_range(tables, list(nab_index), files, nab_index),
            _f1_range(tables, wg_family, files, nab_index),
            scored(tables, WG_QUIETED.key, files, nab_index[WG_QUIETED.key]),
            fold.chosen, fold.baseline,
            scored(tables, fold.chosen.key, files, fold.chosen.index),
            scored(tables, BASELINE.key, files, fold.baseline.index),
            fold.ours_range.get("f1"), fold.base_range.get("f1"),
            scored(tables, FROZEN.key, files, frozen_index),
            oracle(tables, FROZEN.key, files), oracle(tables, BASELINE.key, files)))
    pooled = {name: _pool([getattr(r, name) for r in results])
              for name in ("from_nab", "from_nab_wg", "from_nab_wg_quieted", "lofo", "lofo_wg",
                           "frozen")}
    return TransferReport(results, nab_choice, nab_wg, pooled, [c.key for c in candidates],
                          len(series), sum(len(s.times) for s in series.values()),
                          sum(s.duplicates for s in series.values()),
                          {**{f"NAB {k}": v for k, v in nab_seconds.items()},
                           **{f"cloud_kpi {k}": v for k, v in seconds.items()}})


# -- the report -----------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _thr(t: float) -> str:
    """A threshold readably: 1 - 10**-k in the far tail."""
    if t == 1.0 or t < 0.999:
        return f"{t:.4g}"
    return f"1-{1.0 - t:.1e}"


def _cell(s: Scored | None, rng: tuple[float, float] | None = None) -> str:
    if s is None:
        return "n/a"
    if s.f1 is None:
        return "n/a (no events)"
    span = f" [{rng[0]:.2f}-{rng[1]:.2f}]" if rng else ""
    return f"{_num(s.f1)} ({_num(s.precision)}/{_num(s.recall)}){span}"


def _fp(s: Scored | None, quiet_series: int) -> str:
    if s is None:
        return "n/a"
    quiet = f"{s.quiet_fp}" if quiet_series else "-"
    return f"{s.counts.fp} / {quiet}"


def _short(key: str) -> str:
    return key.replace("() quiet=", " q").replace(" quiet=", " q")


def render(report: TransferReport) -> str:
    """Markdown: (a) NAB -> cloud_kpi, (b) leave one family out, (c) references."""
    nab, wg = report.nab_choice, report.nab_wg_choice
    fams = report.families
    wg_quieted = fams[0].from_nab_wg_quieted.threshold if fams else float("nan")
    total_series = sum(f.series for f in fams)
    total_quiet = sum(f.quiet_series for f in fams)
    total_events = sum(f.events for f in fams)
    head = ("| Family (series, quiet, events) | {a} | FPs all / quiet: {a2} | {b} | "
            "FPs all / quiet: {b2} | {c} | FPs all / quiet |")
    lines = [
        f"**(a) Chosen on all of NAB, scored on cloud_kpi** ({report.series} series, "
        f"{report.rows} points). Chosen: {_short(nab.key)} at {_thr(nab.threshold)}; "
        f"windowed Gaussian (WG) at {_thr(wg.threshold)}. Event-F1 (precision/recall); "
        "brackets: over the grid / the WG family, each candidate at its threshold chosen on "
        f"NAB. WG q{WG_QUIETED.quiet}: the WG behind the NAB choice's quiet period "
        f"({WG_QUIETED.quiet} points after an alert), at {_thr(wg_quieted)} chosen on NAB.",
        "",
        head.format(a="F1 (P/R) [grid]: chosen on NAB", a2="chosen",
                    b="F1 (P/R) [WG family]: WG on NAB",
                    b2="WG", c=f"F1 (P/R): WG q{WG_QUIETED.quiet} on NAB"),
        "|---|---|---|---|---|---|---|",
    ]

    def label(f: FamilyResult) -> str:
        return f"{f.family} ({f.series}, {f.quiet_series}, {f.events})"

    pooled_label = f"**all, pooled** ({total_series}, {total_quiet}, {total_events})"
    for f in fams:
        lines.append(f"| {label(f)} | {_cell(f.from_nab, f.from_nab_range)} | "
                     f"{_fp(f.from_nab, f.quiet_series)} | "
                     f"{_cell(f.from_nab_wg, f.from_nab_wg_range)} | "
                     f"{_fp(f.from_nab_wg, f.quiet_series)} | {_cell(f.from_nab_wg_quieted)} | "
                     f"{_fp(f.from_nab_wg_quieted, f.quiet_series)} |")
    p = report.pooled
    lines.append(f"| {pooled_label} | {_cell(p['from_nab'])} | {_fp(p['from_nab'], total_quiet)}"
                 f" | {_cell(p['from_nab_wg'])} | {_fp(p['from_nab_wg'], total_quiet)} | "
                 f"{_cell(p['from_nab_wg_quieted'])} | "
                 f"{_fp(p['from_nab_wg_quieted'], total_quiet)} |")
    lines += [
        "",
        "**(b) Leave one family out inside cloud_kpi** (candidate and threshold chosen on the "
        "other five by NAB standard score; brackets: held-out F1 over the grid / over the WG "
        "family, each at its threshold chosen on the five).",
        "",
        "| Held out (series, quiet, events) | Chosen on the other 5 (threshold) | F1 (P/R) "
        "[grid] | FPs all / quiet | WG threshold | WG F1 (P/R) [WG family] | WG FPs all / "
        "quiet |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in fams:
        lines.append(f"| {label(f)} | {_short(f.lofo_choice.key)} ({_thr(f.lofo_choice.threshold)})"
                     f" | {_cell(f.lofo, f.lofo_range)} | {_fp(f.lofo, f.quiet_series)} | "
                     f"{_thr(f.lofo_wg_choice.threshold)} | {_cell(f.lofo_wg, f.lofo_wg_range)}"
                     f" | {_fp(f.lofo_wg, f.quiet_series)} |")
    lines.append(f"| {pooled_label} | | {_cell(p['lofo'])} | {_fp(p['lofo'], total_quiet)} | | "
                 f"{_cell(p['lofo_wg'])} | {_fp(p['lofo_wg'], total_quiet)} |")
    lines += [
        "",
        f"**(c) References**: the NAB-standard choice as frozen, the live default until 2026-12-06 "
        f"({_short(FROZEN.key)} at {_thr(NAB_STANDARD_CHOICE.threshold)}); ORACLE = at the "
        "family's own best event-F1 threshold (optimistic by construction).",
        "",
        "| Family (series, quiet, events) | Frozen NAB choice F1 (P/R) | FPs all / quiet | ORACLE "
        "live: threshold, F1 (P/R) | ORACLE WG: threshold, F1 (P/R) |",
        "|---|---|---|---|---|",
    ]
    for f in fams:
        ol, ow = f.frozen_oracle, f.wg_oracle
        lines.append(
            f"| {label(f)} | {_cell(f.frozen)} | {_fp(f.frozen, f.quiet_series)} | "
            f"{_thr(ol.threshold) + ', ' + _cell(ol) if ol else 'n/a'} | "
            f"{_thr(ow.threshold) + ', ' + _cell(ow) if ow else 'n/a'} |")
    lines.append(f"| {pooled_label} | {_cell(p['frozen'])} | {_fp(p['frozen'], total_quiet)} | "
                 "| |")
    same = (nab.key, nab.threshold) == (FROZEN.key, NAB_STANDARD_CHOICE.threshold)
    lines += [
        "",
        f"Grid: {len(report.candidates)} candidates x {len(THRESHOLDS)} thresholds. The choice on "
        f"NAB {'is' if same else 'is NOT'} the frozen NAB_STANDARD_CHOICE (the live default "
        "until 2026-12-06; now aiops_harness.evals.detector_choice). {report.duplicates} rows "
        "with a repeated timestamp dropped. Events: labelled runs after the probation (first "
        "15 %, at most 750 rows). Streaming seconds (0: cached): "
        + ", ".join(f"{k} {s:.0f}" for k, s in report.seconds.items()) + ".",
    ]
    return "\n".join(lines)

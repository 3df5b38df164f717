"""The run's headline figures: the best's speedup over the initial kernel and over the reference.

Every place that shows them (the summary at the end of `agent optimize`, the kept commit's message,
`agent show`, `agent runs`, report.md and its plot) takes them from here, so that one run never
shows two different numbers for one claim, and each number says which measurement it comes from:

- **confirmed**: the confirmation bench (runs/RUN/confirm.json), run when the target looks reached
  and at the end: the best, the initial kernel and the reference timed in the same rounds, the order
  rotated round by round; each speedup is the median of the per-round ratios with a 95% interval.
- **side by side**, against the reference, for a best kept since: its keep's confirmation bench timed it, its
  parent and the reference in the same rounds (issue 63: the product below told a model 3.160x while its own times
  gave 1.32x, the reference having moved since the setup).
- **estimate**, until the best is confirmed: the product of the kept steps' speedups, each measured
  against its parent in an interleaved bench (the same chain the review's ablation table and
  `agent cherry-pick` show), and for the reference that product times the initial kernel's speedup
  over the reference measured at setup (also interleaved). Not the ratio of two medians taken minutes
  apart in different processes: those move with whatever else the machine is doing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.records.schema import RunState

SOURCES = {
    True: "confirmation bench: best, initial kernel and reference timed interleaved",
    False: "estimate: product of the kept steps, each timed against its parent interleaved",
}
SIDE_BY_SIDE = "its keep's confirmation bench: the best and the reference timed interleaved"
SETUP = "the setup bench: the initial kernel and the reference timed interleaved"


@dataclass(frozen=True)
class Figure:
    value: float
    low: float | None = None
    high: float | None = None
    confirmed: bool = False
    side_by_side: bool = False     # from the best's keep's confirmation bench (vs the reference only)
    setup: bool = False            # the initial kernel is the best: the setup bench's figure, no step multiplied

    def text(self) -> str:
        ci = f" [{self.low:.3f}, {self.high:.3f}]" if self.low is not None and self.high is not None else ""
        return f"{self.value:.3f}x{ci}"

    @property
    def source(self) -> str:
        if self.confirmed:
            return SOURCES[True]
        return SIDE_BY_SIDE if self.side_by_side else SETUP if self.setup else SOURCES[False]


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def best_figure(st: RunState, which: str) -> Figure | None:
    """The best's speedup over "initial" or "reference" (see the module docstring)."""
    if which not in ("initial", "reference"):
        raise ValueError(f"which must be 'initial' or 'reference', not {which!r}")
    if st.confirmed_sha and st.confirmed_sha == st.best_sha:
        if which == "initial" and _finite(st.confirmed_vs_initial):
            return Figure(st.confirmed_vs_initial, st.confirmed_vs_initial_low, st.confirmed_vs_initial_high, True)
        if which == "reference" and _finite(st.confirmed_vs_reference):
            return Figure(st.confirmed_vs_reference, st.confirmed_vs_reference_low, st.confirmed_vs_reference_high,
                          True)
    return estimate(st, which)


def estimate(st: RunState, which: str) -> Figure | None:
    """The estimate alone (a commit just kept is never confirmed yet): against the reference, its keep's
    side-by-side figure where the best has one."""
    chain = st.chain_vs_initial
    if chain is None and _finite(st.initial_ms) and _finite(st.best_ms):   # a run logged before the chain existed
        chain = st.initial_ms / st.best_ms
    if not _finite(chain):
        return None
    if which == "initial":
        return Figure(chain)
    if st.kept_sha and st.kept_sha == st.best_sha and _finite(st.kept_vs_reference):
        return Figure(st.kept_vs_reference, st.kept_vs_reference_low, st.kept_vs_reference_high, side_by_side=True)
    base = initial_vs_reference(st)
    return Figure(chain * base, setup=st.best_iteration is None and chain == 1.0) if base is not None else None


def initial_vs_reference(st: RunState) -> float | None:
    """The initial kernel's speedup over the reference: the setup bench's interleaved ratio, or for a
    run logged before it existed the ratio of the two medians."""
    base = st.initial_vs_reference
    if base is None and _finite(st.reference_ms) and _finite(st.initial_ms):
        base = st.reference_ms / st.initial_ms
    return base if _finite(base) else None


def us(ms: float | None) -> str:
    """A time given in milliseconds, in the unit that reads best."""
    if ms is None or not math.isfinite(ms):
        return "-"
    return f"{ms:.3f} ms" if ms >= 1.0 else f"{ms * 1e3:.1f} us"


def _confirmed_ms(st: RunState) -> dict[str, float] | None:
    """The run's confirmation bench's medians by arm, where they are the best's (and the best is not the initial)."""
    c = st.confirmed_ms if st.confirmed_sha and st.confirmed_sha == st.best_sha and st.best_iteration else None
    return c if c and _finite(c.get("candidate")) else None


def _kept_ms(st: RunState) -> dict[str, float] | None:
    """The best's keep's confirmation bench's medians by arm, where the best has them."""
    k = st.kept_ms if st.kept_sha and st.kept_sha == st.best_sha else None
    return k if k and _finite(k.get("candidate")) else None


def standing_times(st: RunState) -> tuple[float | None, float | None, str]:
    """The best's and the reference's medians from ONE bench where there is one, and which: the confirmation bench,
    else the best's keep's confirmation bench; else the best's from its keep and the reference's from the setup,
    said to be apart."""
    if c := _confirmed_ms(st):
        return c["candidate"], c.get("reference"), "both from the run's confirmation bench"
    if k := _kept_ms(st):
        return k["candidate"], k.get("reference"), "both from the best's keep's confirmation bench, side by side"
    if st.best_iteration is None:
        return st.best_ms, st.reference_ms, "both from the setup bench"
    return st.best_ms, st.reference_ms, "the best's from its keep, the reference's from the setup bench, earlier"


def times_line(st: RunState) -> str:
    """The best's, the initial kernel's and the reference's medians, each group labelled with the
    measurement it comes from: three medians from different benches minutes apart do not divide into
    the figures beside them, and a reader will divide them."""
    if c := _confirmed_ms(st):
        ref = us(c["reference"]) if "reference" in c else "unstable"
        return f"{us(c['candidate'])} (initial {us(c.get('baseline'))}, reference {ref}; the confirmation bench)"
    ref = us(st.reference_ms) if st.reference_ms is not None else "unstable or not timed"
    if st.best_iteration is None:
        return f"{us(st.best_ms)}, the initial kernel (reference {ref}; the setup bench)"
    if k := _kept_ms(st):
        kref = us(k["reference"]) if "reference" in k else "unstable"
        return (f"{us(k['candidate'])} (its parent {us(k.get('baseline'))}, reference {kref}; its keep's confirmation "
                f"bench); initial {us(st.initial_ms)} (the setup bench, earlier)")
    return (f"{us(st.best_ms)} (its keep's bench); initial {us(st.initial_ms)}, reference {ref} "
            "(the setup bench, earlier: not comparable with the best's time)")


def figures_line(st: RunState) -> str:
    """One line with both figures and their source, the same wherever a run's result is shown."""
    vi, vr = best_figure(st, "initial"), best_figure(st, "reference")
    if vi is None and vr is None:
        return "no figures (the initial kernel was never timed)"
    parts = [f"{vi.text()} vs initial" if vi else "- vs initial",
             f"{vr.text()} vs reference" if vr else "- vs reference"]
    source = (vi or vr).source
    if vi and vr and vi.source != vr.source:
        source = f"vs initial: {vi.source}; vs reference: {vr.source}"
    return f"{', '.join(parts)} ({source})"

"""runs/RUN/speedup.png and runs/RUN/roofline.png: what each iteration measured, and where it stands.

speedup.png, top panel: the best so far vs the initial kernel (the product of the kept ratios), a step
line whose steps are labelled with the move that made them, the confirmed (interleaved) figure where
there is one, and always the target: the y range takes it in (log scale, so a far target costs little
room). A target set vs the reference is converted to vs the initial kernel with the times measured at
setup (speedup vs reference >= T exactly when initial_ms/best_ms >= T * initial_ms/reference_ms); with
no reference time the legend says so instead. Bottom panel: each iteration's speedup over the best of
its time with its 95% interval; kept and rejected marked differently, and iterations that never
reached the bench (compile, parity, patch failures) along the bottom edge.

roofline.png (`plot_roofline`), where the task declares FLOP and byte formulas (bench timings then
carry TFLOP/s and GB/s): arithmetic intensity against achieved TFLOP/s, log-log, for the initial
kernel, the reference and each kept iteration, under the device's memory and compute roofs when the
GPU is in tools/measure/roofline.py's table of peaks (a CPU, or a GPU not in the table: no roofs, and the
title says "device peaks unknown"; the CPU figures there are deliberately generous bounds, not peaks).

matplotlib is a default dependency; it is imported lazily and used through `Figure` alone (no pyplot,
no global figure state, no backend to choose). `speedup_figure` and `roofline_figure` build the
figures, `plot_speedup` and `plot_roofline` save them.
"""

from __future__ import annotations

from pathlib import Path

from agent.records.figures import initial_vs_reference
from agent.review.runs import Run
from agent.records.schema import Decision, IterationRecord

INSTALL_HINT = "matplotlib is not installed: pip install matplotlib"
LABEL_CHARS = 24          # a move's label on a plot, at most


class PlotUnavailable(Exception):
    pass


def matplotlib_figure():
    try:
        from matplotlib import ticker
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None
    return Figure, ticker


def shorten(text: str, n: int = LABEL_CHARS) -> str:
    """At most n characters: cut at a word boundary where one is near, with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[:n - 1]
    space = cut.rfind(" ")
    if space >= n // 2:
        cut = cut[:space]
    return cut.rstrip(" :;,.-") + "…"


def move_label(r: IterationRecord) -> str:
    """The move an iteration made, short enough for a plot: the proposal's summary, or for a knob move
    (the heuristic's "SMEM_PAD 0->2: why ...") the move itself."""
    if r.proposal is None:
        return f"iteration {r.iteration}"
    s = r.proposal.summary()
    if r.proposal.knobs is not None and ": " in s:
        s = s.split(": ", 1)[0]
    return shorten(s)


def cumulative(run: Run) -> list[tuple[int, float]]:
    """(iteration, best-so-far vs initial as the product of kept ratios), starting at (0, 1.0)."""
    out, c = [(0, 1.0)], 1.0
    for r in run.records:
        ci = r.bench.speedup_vs_baseline if r.bench else None
        if r.decision == Decision.kept and ci is not None:
            c *= ci.median
        out.append((r.iteration, c))
    return out


def target_vs_initial(run: Run) -> tuple[float | None, str]:
    """The target as the top panel draws it (vs the initial kernel), and its legend text; None where it
    cannot be converted (a target vs the reference with no reference or initial time).

    A speedup vs the reference is the one vs the initial kernel times the initial kernel's speedup over
    the reference (agent/records/figures.py): timed interleaved at setup where the state has it, else
    reference_ms / initial_ms. So T vs reference is T / that vs initial, i.e. T * initial_ms / reference_ms."""
    t, st = run.cfg.target, run.state
    if run.cfg.baseline != "reference":
        return t, f"target {t:g}x vs initial"
    base = initial_vs_reference(st)
    if not base:
        return None, f"target {t:g}x vs reference: not drawn (no reference time recorded)"
    y = t / base
    return y, f"target {t:g}x vs reference (= {y:.3g}x vs initial)"


# --- speedup.png -------------------------------------------------------------------------------
def speedup_figure(run: Run):
    """The two-panel figure of plot_speedup, unsaved (a matplotlib Figure)."""
    Figure, ticker = matplotlib_figure()
    fig = Figure(figsize=(9, 6.5), layout="constrained")
    top, bot = fig.subplots(2, 1, sharex=True, height_ratios=[1, 1.2])
    cum = cumulative(run)
    top.step([i for i, _ in cum], [c for _, c in cum], where="post", color="tab:blue", lw=2,
             label="best so far (product of kept ratios)")
    # the step changes: one per kept iteration with a timing, labelled with its move
    steps = [(r, c) for r, (_, c) in zip(run.records, cum[1:])
             if r.decision == Decision.kept and r.bench and r.bench.speedup_vs_baseline]
    if steps:
        top.plot([r.iteration for r, _ in steps], [c for _, c in steps], "o", color="tab:green", ms=5, zorder=3)
    for k, (r, c) in enumerate(steps):
        up = k % 2 == 0     # alternate above and below the line: neighbouring labels do not collide
        top.annotate(move_label(r), (r.iteration, c), xytext=(5, 7 if up else -7), textcoords="offset points",
                     va="bottom" if up else "top", fontsize=8, color="tab:green")
    vi = run.best_speedup("initial")
    last = cum[-1][0]
    if vi is not None and vi.confirmed:
        err = None
        if vi.low is not None and vi.high is not None:
            err = [[max(vi.value - vi.low, 0)], [max(vi.high - vi.value, 0)]]
        top.errorbar([last], [vi.value], yerr=err, fmt="*", ms=14, color="tab:purple", capsize=4,
                     label=f"confirmed, interleaved: {vi.value:.2f}x")
    shown = [c for _, c in cum] + ([vi.high or vi.value] if vi is not None and vi.confirmed else [])
    ty, tlabel = target_vs_initial(run)
    if ty is not None:
        top.axhline(ty, color="tab:gray", ls="--", lw=1, label=tlabel)
        shown.append(ty)
    else:
        top.plot([], [], " ", label=tlabel)
    top.set_yscale("log")
    top.set_ylim(min(shown) / 1.3, max(shown) * 1.6)
    top.set_ylabel("best so far vs initial\n(log scale)")
    top.grid(alpha=0.3, which="both")
    top.legend(loc="best", fontsize=9, framealpha=0.9)
    top.set_title(f"run {run.id}: {run.cfg.task}, proposer {run.cfg.proposer}", fontsize=11)

    bot.axhline(1.0, color="black", lw=0.8)
    kept = [r for r in run.records if r.bench and r.bench.speedup_vs_baseline and r.decision == Decision.kept]
    rej = [r for r in run.records if r.bench and r.bench.speedup_vs_baseline and r.decision != Decision.kept]
    for group, kw in ((kept, dict(fmt="o", color="tab:green", ms=9, label="kept")),
                      (rej, dict(fmt="x", color="tab:red", ms=9, mew=2, label="rejected"))):
        if not group:
            continue
        xs_ = [r.iteration for r in group]
        ys = [r.bench.speedup_vs_baseline.median for r in group]
        lo = [max(y - r.bench.speedup_vs_baseline.low, 0) for r, y in zip(group, ys)]
        hi = [max(r.bench.speedup_vs_baseline.high - y, 0) for r, y in zip(group, ys)]
        bot.errorbar(xs_, ys, yerr=[lo, hi], capsize=3, elinewidth=1, ls="none", **kw)
        for x, y in zip(xs_, ys):
            bot.annotate(f"{y:.2f}x", (x, y), xytext=(7, 0), textcoords="offset points", va="center", fontsize=8,
                         color=kw["color"])
    untimed = [r for r in run.records if not (r.bench and r.bench.speedup_vs_baseline)]
    if untimed:
        bot.scatter([r.iteration for r in untimed], [0.04] * len(untimed), marker="v", color="tab:orange", s=60,
                    transform=bot.get_xaxis_transform(), clip_on=False, label="failed before timing")
        for r in untimed:
            bot.annotate(r.outcome.value.replace("_", " "), (r.iteration, 0.04), xycoords=("data", "axes fraction"),
                         xytext=(4, 6), textcoords="offset points", fontsize=7, color="tab:orange", rotation=30)
    bot.set_yscale("log")
    for ax in (top, bot):
        _times_axis(ax, ticker)
    bot.set_ylabel("speedup over the best of its time\n(median, 95% CI; log scale)")
    bot.set_xlabel("iteration")
    bot.grid(alpha=0.3, which="both")
    bot.legend(loc="best", fontsize=9)
    n = max((r.iteration for r in run.records), default=1)
    bot.set_xlim(-0.3, n + 0.5)
    bot.set_xticks(range(0, n + 1))
    return fig


def plot_speedup(run: Run, path: Path) -> Path:
    fig = speedup_figure(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _times_axis(ax, ticker) -> None:
    """A log axis labelled 0.5x, 1x, 2x, ... rather than 10^0."""
    fmt = ticker.FuncFormatter(lambda v, _: f"{v:g}x")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())

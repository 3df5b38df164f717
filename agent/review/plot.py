"""runs/RUN/speedup.png: what each iteration measured, and where the best stood after it.

Top panel: the best so far vs the initial kernel (the product of the kept ratios), a step line, with
the target and the confirmed (interleaved) figure where there is one. Bottom panel: each iteration's
speedup over the best of its time with its 95% interval; kept and rejected marked differently, and
iterations that never reached the bench (compile, parity, patch failures) along the bottom edge.

matplotlib is imported lazily with the Agg backend: it is an optional dependency (`report` extra).
"""

from __future__ import annotations

from pathlib import Path

from agent.review.runs import Run
from agent.runlog import Decision

INSTALL_HINT = "matplotlib is not installed: pip install 'kernel-agent[report]' (or pip install matplotlib)"


class PlotUnavailable(Exception):
    pass


def cumulative(run: Run) -> list[tuple[int, float]]:
    """(iteration, best-so-far vs initial as the product of kept ratios), starting at (0, 1.0)."""
    out, c = [(0, 1.0)], 1.0
    for r in run.records:
        ci = r.bench.speedup_vs_baseline if r.bench else None
        if r.decision == Decision.kept and ci is not None:
            c *= ci.median
        out.append((r.iteration, c))
    return out


def plot_speedup(run: Run, path: Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None

    fig, (top, bot) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=[1, 1.2],
                                   layout="constrained")
    cum = cumulative(run)
    top.step([i for i, _ in cum], [c for _, c in cum], where="post", color="tab:blue", lw=2,
             label="best so far (product of kept ratios)")
    vi = run.best_speedup("initial")
    last = cum[-1][0]
    if vi is not None and vi.confirmed:
        err = None
        if vi.low is not None and vi.high is not None:
            err = [[max(vi.value - vi.low, 0)], [max(vi.high - vi.value, 0)]]
        top.errorbar([last], [vi.value], yerr=err, fmt="*", ms=14, color="tab:purple", capsize=4,
                     label=f"confirmed, interleaved: {vi.value:.2f}x")
    shown = [c for _, c in cum] + ([vi.high or vi.value] if vi is not None and vi.confirmed else [])
    if run.cfg.baseline == "initial":
        if run.cfg.target <= 3 * max(shown):
            top.axhline(run.cfg.target, color="tab:gray", ls="--", lw=1, label=f"target {run.cfg.target:g}x")
        else:   # a far target would flatten everything else: name it instead of drawing it
            top.plot([], [], " ", label=f"target {run.cfg.target:g}x (off the chart)")
    top.set_yscale("log")
    top.set_ylim(min(shown) / 1.25, max(shown) * 1.6)
    top.set_ylabel("best so far vs initial\n(log scale)")
    top.grid(alpha=0.3, which="both")
    top.legend(loc="upper left", fontsize=9, framealpha=0.9)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _times_axis(ax, ticker) -> None:
    """A log axis labelled 0.5x, 1x, 2x, ... rather than 10^0."""
    fmt = ticker.FuncFormatter(lambda v, _: f"{v:g}x")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())

"""`agent report RUN`: runs/RUN/report.md with the summary, the ablation of kept commits, the rejected
hypotheses with their reasons, the environment, and the plot runs/RUN/speedup.png embedded."""

from __future__ import annotations

import json
from pathlib import Path

from agent.records.figures import figures_line, times_line
from agent.review.plot import PlotUnavailable, plot_speedup
from agent.review.roofline import plot_roofline
from agent.review.runs import Run
from agent.review.show import env_pairs, throughput, xs
from agent.records.schema import Decision, IterationRecord
from tools.results import BenchResult

PROFILE_KEYS = ("ctas", "sol_compute_pct", "sol_memory_pct", "dram_pct", "occupancy_achieved_pct", "registers")


def _md(text: str) -> str:
    """One table cell: no pipes, no newlines."""
    return " ".join(text.split()).replace("|", "\\|")


def initial_profile_summary(run: Run) -> dict | None:
    p = run.dir / "initial" / "profile.json"
    if not p.exists():
        return None
    try:
        from tools.profile.compact import profile_summary
        from tools.profile.model import ProfileReport
        return profile_summary(ProfileReport.model_validate_json(p.read_text()))
    except (ImportError, ValueError):
        return None


def metric_deltas(before: dict | None, after: dict | None) -> str:
    if not after:
        return "-"
    out = []
    for k in PROFILE_KEYS:
        a = after.get(k)
        b = before.get(k) if before else None
        if not isinstance(a, (int, float)):
            continue
        if isinstance(b, (int, float)) and b != a:
            out.append(f"{k} {_num(b)}->{_num(a)}")
        elif b is None:
            out.append(f"{k} {_num(a)}")
    if after.get("bottleneck") and (not before or before.get("bottleneck") != after.get("bottleneck")):
        out.append(f"bottleneck {after['bottleneck']}")
    return ", ".join(out) or "no change"


def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def ablation_rows(run: Run) -> list[dict]:
    rows, cum, prev = [], 1.0, initial_profile_summary(run)
    for r in run.kept():
        ci = r.bench.speedup_vs_baseline if r.bench else None
        if ci is not None:
            cum *= ci.median
        rows.append({"iteration": r.iteration, "sha": (r.commit_sha or "")[:10],
                     "hypothesis": r.proposal.summary() if r.proposal else "-",
                     "speedup": ci.median if ci else None, "low": ci.low if ci else None,
                     "high": ci.high if ci else None, "cumulative": cum,
                     "metrics": metric_deltas(prev, r.profile_summary)})
        prev = r.profile_summary or prev
    return rows


def render(run: Run, plot_name: str | None, plot_note: str = "", roofline_name: str | None = None) -> str:
    cfg, st = run.cfg, run.state
    vi = run.best_speedup("initial")
    best = "the initial kernel" if st.best_iteration is None else f"iteration {st.best_iteration}"
    L = [f"# Run {cfg.run_id}: {cfg.task}", "",
         f"- **Result**: {figures_line(st)}; target {cfg.target:g}x vs {cfg.baseline}",
         f"- **Best**: {best}, commit `{st.best_sha[:10]}` on branch `{cfg.branch}`: {times_line(st)}",
         *_throughput_lines(run),
         f"- **Stopped**: {st.status}: {st.stop_reason or '-'}",
         f"- **Iterations**: {len(run.records)} of {cfg.iters}, {len(run.kept())} kept; proposer {cfg.proposer}"
         + (f" ({cfg.model})" if cfg.model else ""),
         f"- **Started**: {cfg.started}" + (f", finished {st.finished}" if st.finished else ""),
         f"- **LLM usage**: {st.usage.calls} calls, {st.usage.prompt_tokens + st.usage.completion_tokens} tokens, "
         f"${st.usage.cost_usd:.4f}", ""]
    if run.notes:   # what could not be read (a torn or lost record, a damaged state): the report is of the rest
        L[-1:-1] = [f"- **Not read**: {_md(n)}" for n in run.notes]
    if plot_name:
        L += [f"![speedup per iteration]({plot_name})", ""]
    if roofline_name:
        L += [f"![roofline: achieved TFLOP/s against arithmetic intensity]({roofline_name})", ""]
    elif plot_note:
        L += [f"_Plot not drawn: {plot_note}_", ""]
    L += ["## Ablation: the kept commits", ""]
    rows = ablation_rows(run)
    if rows:
        L += ["| # | commit | hypothesis | speedup over parent (CI) | cumulative | profile metrics |",
              "|---|---|---|---|---|---|"]
        for a in rows:
            sp = f"{a['speedup']:.3f}x ({a['low']:.3f}-{a['high']:.3f})" if a["speedup"] is not None else "-"
            L.append(f"| {a['iteration']} | `{a['sha']}` | {_md(a['hypothesis'])} | {sp} | {a['cumulative']:.3f}x | "
                     f"{_md(a['metrics'])} |")
        L += ["", "Cumulative is the product of the kept ratios, each timed against its parent interleaved."]
        if vi and vi.confirmed:
            L.append(f"The confirmation bench timed the best against the initial kernel interleaved: "
                     f"{vi.text()}.")
    else:
        L.append("No iteration was kept: the initial kernel is still the best.")
    L += ["", "## Rejected hypotheses", ""]
    rejected = [r for r in run.records if r.decision != Decision.kept]
    if rejected:
        L += ["| # | outcome | hypothesis | speedup over best | reason |", "|---|---|---|---|---|"]
        for r in rejected:
            L.append(f"| {r.iteration} | {r.outcome.value} | {_md(_hyp(r))} | {xs(r.speedup_vs_best)} | "
                     f"{_md(r.reason)} |")
    else:
        L.append("None.")
    L += ["", "## Environment", "", "| | |", "|---|---|"]
    L += [f"| {k} | {_md(v)} |" for k, v in env_pairs(run)]
    L += ["", "## Configuration", "", "```json",
          json.dumps({k: v for k, v in cfg.model_dump(mode="json").items() if k != "env"}, indent=2), "```", ""]
    return "\n".join(L)


def _throughput_lines(run: Run) -> list[str]:
    """The best's, the initial kernel's and the reference's throughput (with the share of the device's
    peak where it is known), where the task declares its FLOPs and bytes."""
    timed: list[tuple[str, BenchResult | None, str]] = []
    if run.state.best_iteration is not None and (best := run.find(run.state.best_iteration)) is not None:
        timed.append(("best", best.bench, "candidate"))   # a best whose record is lost: its throughput is not known
    try:
        initial = BenchResult.model_validate_json((run.dir / "initial" / "bench.json").read_text())
        timed += [("initial", initial, "candidate"), ("reference", initial, "reference")]
    except (OSError, ValueError):
        pass
    parts = []
    for name, b, label in timed:
        tm = b.timing(label) if b else None
        tp = throughput(tm, b.peak) if tm else ""
        if tp:
            parts.append(f"{name} {tp}")
    peak = next((b.peak for _, b, _ in timed if b and b.peak), None)
    return [f"- **Throughput**: {'; '.join(parts)}" + (f" (% of the {peak.label} peak)" if peak else "")] \
        if parts else []


def _hyp(r: IterationRecord) -> str:
    return r.proposal.summary() if r.proposal else (r.proposal_error or "-")


def write_report(run: Run) -> tuple[Path, list[Path], str]:
    """Write report.md, speedup.png and, where the task declares FLOPs and bytes, roofline.png.
    Returns (report, the plots written, a note when the plots are missing)."""
    png, roof, note = run.dir / "speedup.png", None, ""
    try:
        plot_speedup(run, png)
        roof = plot_roofline(run, run.dir / "roofline.png")
    except PlotUnavailable as e:
        png, note = None, str(e)
    md = run.dir / "report.md"
    md.write_text(render(run, png.name if png else None, note, roof.name if roof else None))
    return md, [p for p in (png, roof) if p is not None], note


__all__ = ["write_report", "render", "ablation_rows", "metric_deltas"]

"""`agent show RUN [--iter N]`: a run's summary, or one iteration in full, as rich renderables or JSON."""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from agent.records.figures import figures_line, times_line, us
from agent.review.plot import shorten
from agent.review.runs import Run
from agent.records.schema import Decision, IterationRecord
from tools.results import DevicePeak, ParityResult, TimingStats
from tools.task import shape_label

DECISION_STYLE = {Decision.kept: "green", Decision.reverted: "red", Decision.skipped: "yellow",
                  Decision.interrupted: "magenta", Decision.revoked: "red"}


def xs(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None and math.isfinite(v) else "-"


def throughput(tm: TimingStats, peak: DevicePeak | None) -> str:
    """What a time means for the hardware: FLOP/s and bytes/s where the task declares its FLOPs and
    bytes, each with its share of the device's peak where it is known (a GPU's spec sheet, a CPU's measured)."""
    parts = []
    rate = lambda t: f"{t:.3g} TFLOP/s" if t >= 0.1 else f"{t * 1e3:.3g} GFLOP/s"   # noqa: E731
    if tm.tflops:
        parts.append(rate(tm.tflops) + (f" ({tm.tflops / peak.tflops:.1%} of {rate(peak.tflops)})" if peak else ""))
    if tm.gbps:
        parts.append(f"{tm.gbps:.3g} GB/s" + (f" ({tm.gbps / peak.gbps:.1%} of {peak.gbps:.4g} GB/s)" if peak else ""))
    return ", ".join(parts)


def ci_text(rec: IterationRecord) -> str:
    ci = rec.bench.speedup_vs_baseline if rec.bench else None
    return f"{ci.median:.3f}x [{ci.low:.3f}, {ci.high:.3f}]" if ci else "-"


# --- the run ----------------------------------------------------------------------------------
def run_json(run: Run) -> dict:
    vi, vr = run.best_speedup("initial"), run.best_speedup("reference")
    return {"config": run.cfg.model_dump(mode="json"), "state": run.state.model_dump(mode="json"), "notes": run.notes,
            "best": {"sha": run.state.best_sha, "iteration": run.state.best_iteration, "ms": run.state.best_ms,
                     "vs_initial": vi.value if vi else None, "vs_reference": vr.value if vr else None,
                     "confirmed": bool(vi and vi.confirmed)},
            "stage_medians_s": stage_medians(run),
            "iterations": [{"iteration": r.iteration, "decision": r.decision.value, "outcome": r.outcome.value,
                            "hypothesis": r.proposal.summary() if r.proposal else None,
                            "speedup_vs_best": r.speedup_vs_best, "reason": r.reason, "commit": r.commit_sha,
                            "seconds": r.times.model_dump(), "wall_s": r.wall_s, "worker": r.worker,
                            "candidates": [c.model_dump(mode="json", include={"candidate", "hypothesis", "outcome",
                                                                                "speedup", "worker"})
                                           for c in r.candidates]}
                           for r in run.records]}


def run_summary(run: Run) -> RenderableType:
    cfg, st = run.cfg, run.state
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    best = "the initial kernel" if st.best_iteration is None else f"iteration {st.best_iteration}"
    for k, v in (
        ("task", f"{cfg.task} ({cfg.task_dir})"),
        ("proposer", cfg.proposer + (f", model {cfg.model}" if cfg.model else "")),
        ("target", f"{cfg.target:g}x vs {cfg.baseline}; {cfg.iters} iterations at most; "
                   f"min gain {cfg.min_gain:.0%}" + _budgets(run)),
        ("branch", f"{cfg.branch} (from {cfg.base_sha[:10]})"),
        ("started", cfg.started + (f", finished {st.finished}" if st.finished else "")),
        ("status", f"{st.status}: {st.stop_reason or '-'}"),
        ("best", f"{best}, {st.best_sha[:10]}, {times_line(st)}"),
        ("speedup", figures_line(st)),
        ("time", stage_line(run)),
        ("usage", f"{st.usage.calls} LLM calls, {st.usage.prompt_tokens + st.usage.completion_tokens} tokens, "
                  f"${st.usage.cost_usd:.4f}"),
    ):
        facts.add_row(k, Text(v))
    parts: list[RenderableType] = [Panel(facts, title=escape(f"run {cfg.run_id}"), expand=False), env_table(run),
                                   iterations_table(run)]
    return Group(*parts)


def _budgets(run: Run) -> str:
    c = run.cfg
    b = [f"{c.budget_tokens} tokens" if c.budget_tokens else "", f"${c.budget_usd:g}" if c.budget_usd else "",
         f"{c.budget_seconds:g} s" if c.budget_seconds else ""]
    b = [x for x in b if x]
    return f"; budget {', '.join(b)}" if b else ""


def env_pairs(run: Run) -> list[tuple[str, str]]:
    e = run.cfg.env
    pairs = [("host", e.host), ("gpu", e.gpu and f"{e.gpu} ({e.sm_count} SMs)"), ("driver", e.driver),
             ("cuda runtime", e.cuda_runtime), ("nvcc", e.nvcc), ("c++", e.cxx), ("ncu", e.ncu), ("torch", e.torch),
             ("python", e.python), ("clocks", e.clocks),
             ("git", f"{e.git_sha[:10]}" + (" (dirty)" if e.git_dirty else ""))]
    return [(k, v) for k, v in pairs if v]


def env_table(run: Run) -> Table:
    t = Table(title="environment", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in env_pairs(run):
        t.add_row(k, Text(v))
    return t


def iterations_table(run: Run) -> Table:
    t = Table(title="iterations", title_justify="left")
    for c in ("#", "decision", "speedup vs best [CI]", "hypothesis", "reason", "time"):
        t.add_column(c, overflow="fold")
    for r in run.records:
        mark = " *" if r.iteration == run.state.best_iteration else ""
        t.add_row(f"{r.iteration}{mark}", f"[{DECISION_STYLE[r.decision]}]{r.decision.value}[/]", ci_text(r),
                  Text(shorten(r.proposal.summary() if r.proposal else r.proposal_error or "-", 60)),
                  Text(shorten(r.reason, 90)),
                  f"{_total(r):.1f} s")
    t.caption = "* the best" if run.state.best_iteration else None
    return t


def stage_medians(run: Run) -> dict[str, float]:
    """Median seconds per stage over the iterations that reached a build, plus `iteration` (the stages
    summed) and `without_proposer` (less proposing: what the loop itself costs); where the records
    have it, `wall` and `wall_without_proposer`, from the iteration's wall clock (gaps included)."""
    recs = [r for r in run.records if r.build is not None]
    if not recs:
        return {}
    out = {k: statistics.median(getattr(r.times, k) for r in recs) for k in r_fields()}
    out["iteration"] = statistics.median(_total(r) for r in recs)
    out["without_proposer"] = statistics.median(_total(r) - r.times.propose for r in recs)
    walled = [r for r in recs if r.wall_s is not None]
    if walled:
        out["wall"] = statistics.median(r.wall_s for r in walled)
        out["wall_without_proposer"] = statistics.median(r.wall_s - r.times.propose for r in walled)
    return out


def r_fields() -> list[str]:
    from agent.records.schema import StageTimes
    return list(StageTimes.model_fields)


def stage_line(run: Run) -> str:
    m = stage_medians(run)
    if not m:
        return "-"
    n = sum(1 for r in run.records if r.build is not None)
    parts = ", ".join(f"{k} {m[k]:.2f}" for k in r_fields() if m[k] >= 0.005)
    wall = (f"; wall clock {m['wall']:.1f}, {m['wall_without_proposer']:.1f} without the proposer"
            if "wall" in m else "")
    return (f"median s per iteration over {n} built: {parts}; whole {m['iteration']:.1f}, "
            f"{m['without_proposer']:.1f} without the proposer" + wall)


def _total(r: IterationRecord) -> float:
    return sum(r.times.model_dump().values())


# --- one iteration ----------------------------------------------------------------------------
def iteration_json(run: Run, rec: IterationRecord) -> dict:
    d = run.dir / f"iter-{rec.iteration}"
    data = rec.model_dump(mode="json")
    data["artifacts"] = sorted(str(p) for p in d.iterdir()) if d.is_dir() else []
    data["parity_by_shape"] = parity_by_shape(rec.parity) if rec.parity else []
    data["notes"] = run.notes
    return data


def parity_by_shape(p: ParityResult) -> list[dict]:
    """One entry per shape: the worst errors over its seeds and distributions."""
    by: OrderedDict[str, dict] = OrderedDict()
    for c in p.checks:
        e = by.setdefault(c.label, {"shape": c.label, "hidden": c.hidden, "checks": 0, "ok": True,
                                    "max_abs_err": None, "max_rel_err": None, "status": "ok"})
        e["checks"] += 1
        e["ok"] = e["ok"] and c.ok
        if not c.ok and e["status"] == "ok":
            e["status"] = c.status.value
        for k in ("max_abs_err", "max_rel_err"):
            v = getattr(c, k)
            if v is not None and math.isfinite(v):
                e[k] = v if e[k] is None else max(e[k], v)
    return list(by.values())


def iteration_detail(run: Run, rec: IterationRecord) -> RenderableType:
    parts: list[RenderableType] = []
    style = DECISION_STYLE[rec.decision]
    head = Text.assemble((f"iteration {rec.iteration} ", "bold"), (rec.decision.value, style),
                         f" ({rec.outcome.value}): {rec.reason}")
    parts.append(head)
    if rec.attempts:   # the attempts before the last, each sent back to the model for repair (agent/optimize/repair.py)
        t = _kv()
        for at in rec.attempts:
            t.add_row(f"attempt {at.attempt}", Text(f"{at.outcome.value}: {at.reason}  [{at.hypothesis}]  "
                                                    f"{at.usage.prompt_tokens}+{at.usage.completion_tokens} tokens"
                                                    + (f", {at.seconds:.1f} s" if at.seconds is not None else "")
                                                    + (f"  ({at.rejected_ref})" if at.rejected_ref else "")))
        t.add_row(f"attempt {len(rec.attempts) + 1}", Text(f"{rec.outcome.value} (below)"))
        parts.append(Panel(t, title="attempts (repaired within the iteration)", expand=False))
    if rec.candidates:   # --candidates K: the others of the iteration's K (agent/optimize/candidates.py)
        t = _kv()
        for c in rec.candidates:
            vs = f", {c.speedup:.3f}x" if c.speedup is not None else ""
            on = f" on {c.worker}" if c.worker else ""
            t.add_row(f"candidate {c.candidate}", Text(f"{c.outcome}{vs}{on}: {c.reason}  [{c.hypothesis}]"
                                                       + (f"  ({c.ref})" if c.ref else "")))
        t.add_row("this one", Text(f"{rec.outcome.value}" + (f" on {rec.worker}" if rec.worker else "") + " (below)"))
        parts.append(Panel(t, title="candidates (evaluated side by side in this iteration)", expand=False))
    p = rec.proposal
    if p is not None:
        t = _kv()
        t.add_row("hypothesis", Text(p.hypothesis))
        for ev in p.evidence:
            t.add_row("evidence", Text(f"{ev.metric} = {ev.value}"))
        t.add_row("predicted", Text(f"{p.predicted.metric} {p.predicted.direction}, {p.predicted.speedup:g}x"))
        if p.knobs:
            t.add_row("knobs", Text(", ".join(f"{k}={v}" for k, v in p.knobs.items())))
        t.add_row("proposer", Text(p.proposer or run.cfg.proposer))
        if rec.patch_message:
            t.add_row("patch", Text(rec.patch_message))
        parts.append(Panel(t, title="proposal", expand=False))
    elif rec.proposal_error:
        parts.append(Text(f"proposal failed: {rec.proposal_error}", style="red"))
    if rec.patch:
        parts.append(Panel(Syntax(rec.patch, "diff", theme="ansi_dark", word_wrap=True), title="diff", expand=False))
    commit = rec.commit_sha[:10] if rec.commit_sha else "-"
    parts.append(Text(f"parent {rec.parent_sha[:10]}  commit {commit}" + (f"  ({rec.rejected_ref})" if rec.rejected_ref
                                                                          else "")))
    parts += _stages(rec)
    if rec.scratch_files:
        t = _kv()
        for n, f in enumerate(rec.scratch_files):
            t.add_row("scratch" if n == 0 else "", Text(f"{f.path} ({f.bytes} B, {f.process}; removed)"))
        parts.append(t)
    parts.append(_times(rec))
    return Group(*parts)


def _kv() -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    return t


def _stages(rec: IterationRecord) -> list[RenderableType]:
    out: list[RenderableType] = []
    b = rec.build
    if b is not None:
        t = _kv()
        t.add_row("build", Text(f"{b.status.value}, {b.seconds:.2f} s, {b.steps_run} step(s)"
                                + (f", {b.arch}" if b.arch else "")))
        if b.message:
            t.add_row("", Text(b.message, style="red"))
        for k in b.kernels:
            spill = k.spill_stores_bytes + k.spill_loads_bytes
            t.add_row("", Text(f"{k.name}: {k.registers} registers, spills {k.spill_stores_bytes}/"
                               f"{k.spill_loads_bytes} B st/ld, smem {k.smem_static_bytes} B",
                               style="yellow" if spill else ""))
        for n, c in enumerate(b.commands):
            t.add_row("commands" if n == 0 else "", Text(c))
        out.append(t)
    la = rec.launch
    if la is not None:
        t = _kv()
        geo = f", {la.main_ctas} CTAs" if la.main_ctas else ""
        geo += f", {la.waves:.2f} waves" if la.waves else ""
        t.add_row("launch", Text(f"{la.status.value} ({la.mode}){geo}" + (f": {la.message}" if la.message else "")))
        for v in la.violations:
            t.add_row("", Text(f"{v.rule}: {v.message}", style="red"))
        out.append(t)
    pa = rec.parity
    if pa is not None:
        t = Table(title=f"parity: {pa.status.value}, {len(pa.checks)} checks, {pa.seconds:.1f} s",
                  title_justify="left")
        for c in ("shape", "checks", "max abs err", "max rel err", "status"):
            t.add_column(c)
        for e in parity_by_shape(pa):
            t.add_row(e["shape"] + (" (hidden)" if e["hidden"] and "hidden" not in e["shape"] else ""), str(e["checks"]), _g(e["max_abs_err"]),
                      _g(e["max_rel_err"]), e["status"] if e["ok"] else f"[red]{e['status']}[/red]")
        out.append(t)
        w = pa.worst()
        if w is not None:
            out.append(Text(f"worst failure: {w.label} ({w.dist}, seed {w.seed}): {w.message or w.status.value}"
                            + (f"; at {w.worst_index} expected {w.expected} got {w.got}" if w.worst_index else ""),
                            style="red"))
        elif pa.message and pa.status.value != "ok":
            out.append(Text(pa.message, style="red"))
    be = rec.bench
    if be is not None:
        t = Table(title=escape(f"bench: {be.status.value} on {shape_label(be.shape) if be.shape else '-'}"
                               + (f", {be.device}" if be.device else "")), title_justify="left")
        for c in ("", "median", "p10", "p90", "reps", "throughput"):
            t.add_column(c, justify="right")
        for tm in be.timings:
            t.add_row(tm.label, us(tm.median_ms), us(tm.p10_ms), us(tm.p90_ms), str(tm.reps), throughput(tm, be.peak))
        out.append(t)
        if be.peak:
            out.append(Text(f"% of peak: {be.peak.label}, {be.peak.tflops:g} TFLOP/s, "
                            f"{be.peak.gbps:g} GB/s", style="dim"))
        ci = be.speedup_vs_baseline
        line = f"speedup over the best: {ci.median:.3f}x ({ci.confidence:.0%} CI {ci.low:.3f}-{ci.high:.3f}, {ci.rounds} rounds)" \
            if ci else "no speedup ratio"
        if be.speedup_vs_reference:
            line += f"; {be.speedup_vs_reference:.3f}x vs the reference"
        if be.message:
            line += f"; {be.message}"
        out.append(Text(line))
    cf = rec.confirm.speedup_vs_baseline if rec.confirm is not None else None
    if cf is not None:
        out.append(Text(f"confirmation bench (a second, independent one): {cf.median:.3f}x "
                        f"({cf.confidence:.0%} CI {cf.low:.3f}-{cf.high:.3f}, {cf.rounds} rounds)"))
    if rec.profile_summary:
        t = _kv()
        t.add_row("profile", Text(", ".join(f"{k}={v}" for k, v in rec.profile_summary.items() if v is not None)))
        out.append(t)
    return out


def _times(rec: IterationRecord) -> RenderableType:
    tm = {k: v for k, v in rec.times.model_dump().items() if v >= 0.0005}
    u = rec.usage
    t = _kv()
    t.add_row("time", Text(", ".join(f"{k} {v:.2f} s" for k, v in tm.items()) + f"; total {_total(rec):.1f} s"))
    t.add_row("usage", Text(f"{u.calls} LLM calls, {u.prompt_tokens} prompt + {u.completion_tokens} completion "
                            f"tokens, ${u.cost_usd:.4f}"))
    return t


def _g(v: float | None) -> str:
    return f"{v:.3g}" if v is not None else "-"

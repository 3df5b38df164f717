"""Steps 1-3 of an iteration: what the proposer sees, its proposal, and the proposal applied to the
run's worktree (with up to PATCH_REPAIRS chances to repair a patch that does not apply)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

from agent.evaluation.attempt import Attempt
from agent.evaluation.ended import EditOutsideEditable, NoChange, PatchDidNotApply
from agent.records.figures import best_figure, standing_times
from agent.optimize.patch import PatchStatus, apply_edits
from agent.proposal import Proposal
from agent.proposers.base import Context, HistoryItem, Proposer, ProposerError
from agent.records.schema import IterationRecord, Outcome, RunState
from tools.profile.model import ProfileReport
from tools.task import Task, TaskError, load_task

PATCH_REPAIRS = 2            # a patch that does not apply goes back to the proposer at most this often


class StopRun(Exception):
    """The proposer can do no more (exhausted, or its budget is spent): the run ends cleanly."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def candidate_ms(r: IterationRecord) -> float | None:
    t = r.bench.timing("candidate") if r.bench is not None else None
    return t.median_ms if t is not None else None


def resources(r: IterationRecord) -> str:
    """What the build and the launch plan already know of a GPU candidate, kept or not (issue 63: a model told only that
    a rejected candidate was slower guessed why, three times of four): per kernel the main shape launches, ptxas's
    registers and spills, its shared memory (static and dynamic), its block and grid, and the theoretical occupancy
    with its limiter (tools/profile/fallback.py, the occupancy calculator's rule on sm_80/sm_90-class per-SM limits).
    "" for a CPU task or a candidate that did not build."""
    if r.build is None or not r.build.kernels:
        return ""
    from tools.measure.launch_rules import match_resources
    from tools.profile.fallback import SmLimits, estimate_occupancy
    lim = SmLimits(regs_per_sm=r.launch.limits.regs_per_sm) if r.launch is not None and r.launch.limits else SmLimits()
    parts, seen = [], set()
    for ln in (r.launch.launches if r.launch is not None else []):
        if ln.kernel in seen or len(seen) == 3:
            continue
        seen.add(ln.kernel)
        k = match_resources(ln.kernel.split("(")[0], r.build.kernels)   # a plan may name it with its signature
        spills = f"{k.spill_stores_bytes + k.spill_loads_bytes} B of spills" if k else "spills unknown"
        smem = (ln.smem_static_bytes or 0) + ln.smem_dynamic_bytes
        occ, limiter, per_sm = estimate_occupancy(ln.threads, ln.registers, smem or None, lim)
        parts.append(f"{ln.kernel.split('(')[0]}: {ln.registers if ln.registers is not None else '?'} registers, {spills}, "
                     f"{ln.smem_static_bytes or 0}+{ln.smem_dynamic_bytes} B shared memory, block {ln.threads}, "
                     f"{ln.ctas} CTAs; theoretical occupancy {occ:g}% ({per_sm} CTAs/SM, limited by {limiter})"
                     + _notes(k))
    if not parts:   # no plan: ptxas alone
        parts = [f"{k.name.split('(')[0]}: {k.registers} registers, {k.spill_stores_bytes + k.spill_loads_bytes} B of "
                 f"spills, {k.smem_static_bytes} B static shared memory{_notes(k)}" for k in r.build.kernels[:3]]
    return "; ".join(parts)


def own_profile(r: IterationRecord) -> str:
    """A rejected GPU candidate's own profile (Best.profile_rejected), its main kernel's few figures beside the best's
    whole profile the prompt carries: why it was slower, measured, not guessed (issue 63). "" for a kept one (its
    profile is the best's) or one not profiled."""
    p = r.profile_summary
    if not p or r.outcome.value == "kept":
        return ""
    pct = lambda v: f"{v:.1f}%" if isinstance(v, (int, float)) else "?"   # noqa: E731
    return (f"{p.get('kernel')} ({p.get('source')}): achieved occupancy {pct(p.get('occupancy_achieved_pct'))}, "
            f"{p.get('registers')} registers, {p.get('ctas')} CTAs, SOL compute {pct(p.get('sol_compute_pct'))}, "
            f"memory {pct(p.get('sol_memory_pct'))}, DRAM {pct(p.get('dram_pct'))}; bottleneck {p.get('bottleneck')}")


def _notes(k) -> str:
    """ptxas' numbered performance notes for the kernel (tools/build/output.py: a serialized wgmma pipeline, an
    injected wait), their line numbers the PTX's."""
    return f"; ptxas (PTX line numbers): {' / '.join(k.advisories)}" if k is not None and k.advisories else ""


REWRITE_SHARE = 0.4    # a kept change to this share of a file's lines (or a whole-file edit) is a rewrite


def rewritten(records: list[IterationRecord], sources: dict[str, str]) -> dict[str, int]:
    """Editable files a kept iteration rewrote (a whole-file edit, or a diff changing REWRITE_SHARE of the file's lines
    now), each with the last such iteration: task.toml's knob descriptions were written for the file as the task
    shipped it (issue 63: after the model's rewrite changed what VEC means, every later prompt described it as before)."""
    out: dict[str, int] = {}
    for r in records:
        if r.outcome.value != "kept" or r.proposal is None:
            continue
        changed = _changed_lines(r.patch)
        for f, text in sources.items():
            whole = any(e.file == f and e.content is not None for e in r.proposal.edits)
            if whole or changed.get(f, 0) >= REWRITE_SHARE * max(1, len(text.splitlines())):
                out[f] = r.iteration
    return out


def _changed_lines(patch: str) -> dict[str, int]:
    """A git diff's changed lines per file, by the file's name relative to the task folder's last part on."""
    out: dict[str, int] = {}
    for block in patch.split("diff --git ")[1:]:
        head, _, body = block.partition("\n")
        name = head.rsplit(" b/", 1)[-1]
        n = sum(1 for ln in body.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
        for i in range(len(name.split("/"))):     # kernels/softmax/softmax.cu counts for softmax.cu too
            key = "/".join(name.split("/")[i:])
            out[key] = out.get(key, 0) + n
    return out


def noise(records: list[IterationRecord]) -> str:
    """The noise this run's benches measured, from their own intervals (issue 63: the model was told the keep rule
    but not how wide an interval this machine gives, so it could not tell a 3% idea from one that would be lost in
    doubt): each first bench's half-width relative to its median, the smallest and the largest and their median."""
    widths = sorted((ci.high - ci.low) / 2 / ci.median for r in records if r.bench is not None
                    for ci in [r.bench.speedup_vs_baseline] if ci is not None and ci.median > 0)
    if not widths:
        return ""
    conf = {f"{r.bench.speedup_vs_baseline.confidence:.0%}" for r in records
            if r.bench is not None and r.bench.speedup_vs_baseline is not None}
    mid = statistics.median(widths)
    n = f"{len(widths)} bench{'es' if len(widths) > 1 else ''}"
    span = (f"+-{100 * widths[0]:.1f}% to +-{100 * widths[-1]:.1f}% around their medians (median +-{100 * mid:.1f}%, "
            f"{n})" if len(widths) > 1 else f"+-{100 * widths[0]:.1f}% around its median ({n})")
    return (f"the first benches' {'/'.join(sorted(conf))} intervals on this run reached {span}: a gain well below "
            f"that half-width is likely to end inconclusive, not kept")


def last_failure(records: list[IterationRecord]) -> tuple[str | None, str | None]:
    """A candidate that failed to compile, launch or match the reference: the proposer sees why."""
    if not records:
        return None, None
    r = records[-1]
    if r.outcome in (Outcome.compile_failed, Outcome.parity_failed, Outcome.launch_rejected):
        hyp = r.proposal.summary() if r.proposal else "the last candidate"
        return f"Iteration {r.iteration} ({hyp}) was rejected: {r.reason}", r.outcome.value
    return None, None


def history_item(r: IterationRecord) -> HistoryItem:
    """What the proposer is shown of an earlier iteration: its hypothesis, the speedup it predicted and the one measured
    (with its interval), its time, its diff, the repairs it went through, and why it ended as it did."""
    ci = r.bench.speedup_vs_baseline if r.bench is not None else None
    p = r.proposal
    return HistoryItem(iteration=r.iteration, hypothesis=p.hypothesis if p else "-", outcome=r.outcome.value,
                       reason=r.reason, speedup=r.speedup_vs_best, knobs=p.knobs if p else None, ms=candidate_ms(r),
                       predicted=p.predicted.speedup if p else None, interval=(ci.low, ci.high) if ci else None,
                       patch=r.patch, repairs=[f"{x.outcome.value}: {x.reason}" for x in r.attempts],
                       resources=resources(r), profile=own_profile(r))


def context(task: Task, i: int, d: Path, records: list[IterationRecord], state: RunState,
            profile: ProfileReport | None, feedback: str | None, kind: str | None,
            run_end: float = float("inf")) -> Context:
    sources = {f: task.path(f).read_text() for f in task.spec.editable}
    history = [history_item(r) for r in records]
    best_ms, reference_ms, times_from = standing_times(state)
    return Context(task=task, iteration=i, sources=sources, profile=profile, history=history,
                   best_ms=best_ms, reference_ms=reference_ms, times_from=times_from,
                   vs_reference=best_figure(state, "reference"),
                   vs_initial=best_figure(state, "initial"), peak=state.peak,
                   knobs=task.read_knobs(), measured_knobs=[state.initial_knobs], rewritten=rewritten(records, sources),
                   noise=noise(records), feedback=feedback, feedback_kind=kind, iter_dir=str(d), run_end=run_end)


def task_error(task_dir: Path) -> str | None:
    """Why the patched task no longer loads (e.g. a knob's #define removed), or None."""
    try:
        load_task(task_dir)
    except TaskError as e:
        return e.message if e.field == "-" else f"{e.field}: {e.message}"
    return None


def propose_and_apply(proposer: Proposer, make_context: Callable[[str | None, str | None], Context],
                      task_dir: Path, editable: list[str], revert: Callable[[], None], stage: Callable[[], None],
                      feedback: tuple[str | None, str | None], a: Attempt, d: Path,
                      ready: Callable[[], None] | None = None) -> tuple[Proposal, str]:
    """Ask for a proposal and apply its edits to the worktree; a patch that does not apply (or breaks
    the task) goes back to a proposer that can repair it. Returns the proposal and the patch's message;
    raises an IterationEnded for a patch that cannot be used, StopRun where the proposer ends the run.
    `ready()` before each apply: the worktree made what the edits go onto (the last keep's checks settled)."""
    text, kind = feedback
    for n in range(PATCH_REPAIRS + 1):
        stage()
        ctx = make_context(text, kind)
        t0 = time.monotonic()
        try:
            proposal, u = proposer.propose(ctx)
        except ProposerError as e:
            a.usage = a.usage + e.usage
            if e.ends_run:
                raise StopRun(str(e)) from None
            raise
        finally:
            a.times.propose += time.monotonic() - t0
        a.usage = a.usage + u
        proposal.proposer = proposal.proposer or proposer.name
        # in the record at once: an interrupt or a refused patch still says what was proposed (and a
        # resumed replay counts it as consumed)
        a.proposal = proposal
        (d / (f"proposal-{n}.json" if n else "proposal.json")).write_text(proposal.model_dump_json(indent=2))
        if ready is not None:
            ready()
        t0 = time.monotonic()
        res = apply_edits(proposal.edits, task_dir, editable)
        a.times.patch += time.monotonic() - t0
        broken = task_error(task_dir) if res.ok else None
        if res.ok and broken is None:
            return proposal, res.message
        revert()   # all-or-nothing, but never trust a half state
        if broken is not None:
            # an edit that drops a knob's #define leaves the task unloadable: a patch that does not
            # apply, with the reason, rather than the end of the run
            text, kind = f"Your edit breaks the task: {broken}", "patch_did_not_apply"
            if n == PATCH_REPAIRS or not proposer.can_repair:
                raise PatchDidNotApply(f"the edit breaks the task: {broken}")
            continue
        if res.status == PatchStatus.outside_editable:
            raise EditOutsideEditable(res.message)
        if res.status == PatchStatus.no_change:
            raise NoChange(res.message)
        text, kind = f"Your patch did not apply:\n{res.message}", res.status.value
        if n == PATCH_REPAIRS or not proposer.can_repair:
            raise PatchDidNotApply(res.message)
    raise AssertionError("unreachable")

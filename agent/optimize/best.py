"""The run's best version and the figures a run reports about it.

The best is a commit (`RunState.best_sha`), its library (runs/RUN/best/), its launch geometry and its
profile. Its speedups are agent/records/figures.py's: the confirmation bench's once the best is confirmed
(here, `confirm`), else the estimate whose terms are measured here and in the loop's keep.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.markup import escape

from agent.evaluation.ended import IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.records.figures import Figure, best_figure, estimate
from agent.records.schema import Outcome, RunConfig, RunState, StageTimes
from agent.records.store import write_json_atomic
from agent.optimize.revoke import LATER_ENV
from agent.optimize.view import View
from tools.profile.model import ProfileReport
from tools.judge.budgets import derive
from tools.results import BenchResult, LaunchResult
from tools.measure.cpu_peak import peak_for
from tools.measure.stats import ci_text
from tools.task import shape_label


PROFILE_MIN_S = 30.0    # a rejected candidate is profiled only with this much of the run's time budget left


class SetupFailed(Exception):
    """The run cannot start (the initial kernel fails to build or fails parity, ...)."""


class Best:
    def __init__(self, run_dir: Path, cfg: RunConfig, state: RunState, evaluator: Evaluator, view: View):
        self.run_dir, self.cfg, self.state, self.evaluator, self.view = run_dir, cfg, state, evaluator, view
        lib_name = f"lib{cfg.task}.so"
        self.lib = run_dir / "best" / lib_name
        self.initial_lib = run_dir / "initial" / lib_name
        self.launch: LaunchResult | None = None
        self.profile: ProfileReport | None = None
        evaluator.budgets = state.stage_budgets      # a resumed run keeps the budgets its setup measured
        evaluator.keep_gain = cfg.min_gain           # below it a candidate's bench skips the probes only a keep needs
        evaluator.spare.tier = cfg.profile_tier      # a keep's ncu pass is started before its candidate is known
        # racecheck after a keep, while the model proposes (agent/optimize/revoke.py): one candidate at a time, unless
        # AGENT_RACECHECK_LATER=0 (beside parity, as with --candidates K)
        evaluator.later = ("racecheck",) if cfg.candidates == 1 and os.environ.get(LATER_ENV, "1") != "0" else ()

    def save(self) -> None:
        write_json_atomic(self.run_dir / "state.json", self.state)

    def measure_initial(self, head_sha: str) -> None:
        """Build, check and time the initial kernel (the branch's first commit); its profile seeds iteration 1."""
        ev, st, times = self.evaluator, self.state, StageTimes()
        self.view.message(f"[bold]initial kernel[/bold]: build, launch check, parity, bench vs reference "
                          f"({shape_label(ev.task.spec.main)})")
        try:
            b = ev.build(times)
            snapshot_lib(b.lib_path, self.lib)
            snapshot_lib(b.lib_path, self.initial_lib)
            # the candidates' pipeline, in one judge child (the launch plan, parity, the bench with the
            # reference): before, parity and the bench were two children, a torch start-up more per run
            a = ev.evaluate_candidate(self.lib, None, times, launch_context=ev.launch_context(b, None),
                                      with_reference=True, verify_launch=True,
                                      profile=(self.run_dir / "initial", self.cfg.profile_tier))
            self.launch, bench, par = a.launch, a.bench, a.parity
        except IterationEnded as e:
            raise SetupFailed(f"the initial kernel cannot be the starting point: {e.reason}") from None
        cand, ref = bench.timing("candidate"), bench.timing("reference")
        st.initial_ms = st.best_ms = cand.median_ms if cand else None
        # the reference's time only where its figure stood (tools.measure.bench: no figure from rounds that
        # disagree): agent/records/figures.py would otherwise make one of the two medians
        st.reference_ms = ref.median_ms if ref and bench.speedup_vs_reference is not None else None
        st.chain_vs_initial, st.initial_vs_reference = 1.0, bench.speedup_vs_reference
        st.peak = bench.peak = peak_for(ev.task, bench.peak)   # a CPU task: this machine's, measured (cached)
        st.best_sha = head_sha
        st.initial_knobs = {k: v for k, v in ev.task.read_knobs().items() if v is not None}
        spec = ev.task.spec
        # the stages' own seconds in the child (from its stage mark on: what a budget counts), not its start-up
        st.stage_budgets = ev.budgets = derive({"parity": par.seconds if par else times.parity, "bench": bench.seconds},
                                               {"parity": spec.parity.timeout_s, "bench": spec.bench.timeout_s})
        dump(self.run_dir / "initial" / "bench.json", bench)
        if par is not None:   # what each shape's check cost, the ranges' among them
            dump(self.run_dir / "initial" / "parity.json", par)
        self.reprofile(self.run_dir / "initial", taken=ev.take_profile(self.lib))
        self.save()
        ev.spare.ensure(ev)     # the first keep's pass and child (agent/evaluation/spares.py) while iteration 1 is proposed
        rci = bench.speedup_vs_reference_ci
        vs_ref = f", reference {st.reference_ms * 1e3:.1f} us: {ci_text(rci)} vs reference" if st.reference_ms else (
            ", reference unstable: no figure against it (its rounds disagreed in two benches; initial/bench.json)"
            if ref else "")
        self.view.message(f"initial: {st.initial_ms * 1e3:.1f} us{vs_ref}")
        if st.stage_budgets:
            self.view.message("candidate stage budgets: " + ", ".join(
                f"{k} {b.seconds:g} s ({b.basis})" for k, b in st.stage_budgets.items()))

    def reprofile(self, out_dir: Path, taken: ProfileReport | None = None) -> None:
        """Profile the best library (CUDA only: a CPU task has no counters; the heuristic explores its
        knobs); a profile with no kernels keeps the previous one. `taken`: the report of the Nsight Compute pass that
        checked this library's launch (Evaluator.take_profile), the profile as it is: no second pass."""
        task = self.evaluator.task
        if not task.backend.gpu:
            self.profile = None
            return
        try:
            from tools.profile import profile_task
        except ImportError:
            self.profile = None
            return
        rep = taken if taken is not None else profile_task(task, self.lib, tier=self.cfg.profile_tier, out_dir=out_dir)
        dump(out_dir / "profile.json", rep)
        self.profile = rep if rep.kernels else self.profile

    def profile_rejected(self, lib: Path, out_dir: Path, a, outcome, run_end: float) -> None:
        """A GPU candidate the keep rule rejected as not faster or inconclusive, profiled as the best is (tier and
        shape), where the run asks for it (--profile-rejected; on by default for a model, which reads it) and its time
        budget leaves room: the model is told why it was slower, not left to guess (issue 63: three of its four
        hypotheses after a rejection were guesses). Its few figures go in the record (profile_summary), the report in
        the iteration's folder; a profiler's failure costs the record nothing."""
        left = run_end - time.monotonic()
        if (not self.cfg.profile_rejected or not self.evaluator.task.backend.gpu or left < PROFILE_MIN_S
                or outcome not in (Outcome.not_faster, Outcome.inconclusive)):
            return
        from tools.profile import profile_task
        from tools.profile.compact import profile_summary
        t0 = time.monotonic()
        rep = profile_task(self.evaluator.task, lib, tier=self.cfg.profile_tier, out_dir=out_dir,
                           timeout_s=min(300.0, left))
        dump(out_dir / "profile.json", rep)
        a.profile_summary = profile_summary(rep)
        a.times.profile += time.monotonic() - t0

    def load_profile(self, path: Path) -> None:
        if path.exists():
            rep = ProfileReport.model_validate_json(path.read_text())
            self.profile = rep if rep.kernels else None

    def speedup_vs(self, which: str) -> Figure | None:
        """The best's speedup over "initial" or "reference" (agent/records/figures.py)."""
        return best_figure(self.state, which)

    def advance(self, bench: BenchResult) -> Figure | None:
        """A candidate is being kept: its time is the best's, its speedup over its parent extends the
        chain; returns the new estimate vs initial (for its commit message)."""
        st, before = self.state, estimate(self.state, "initial")
        st.chain_vs_initial = (before.value if before else 1.0) * bench.speedup_vs_baseline.median
        st.best_ms = bench.timing("candidate").median_ms
        return estimate(st, "initial")

    def side_by_side(self, confirm: BenchResult | None, sha: str) -> None:
        """The new best `sha`'s keep: its confirmation bench timed it beside its parent and the reference, so its
        figure against the reference and the medians shown with it come from that one bench (agent/records/figures.py); the
        best's time is that bench's too. A bench without a stable reference leaves the figure to the estimate."""
        st = self.state
        st.kept_sha, st.kept_ms = sha, None
        st.kept_vs_reference = st.kept_vs_reference_low = st.kept_vs_reference_high = None
        cand = confirm.timing("candidate") if confirm is not None else None
        if cand is None:
            return
        rci = confirm.speedup_vs_reference_ci
        st.kept_vs_reference = confirm.speedup_vs_reference
        st.kept_vs_reference_low, st.kept_vs_reference_high = (rci.low, rci.high) if rci else (None, None)
        st.kept_ms = {t.label: t.median_ms for t in confirm.timings
                      if t.label != "reference" or confirm.speedup_vs_reference is not None}
        st.best_ms = cand.median_ms

    def stop_reason(self, run_end: float) -> str | None:
        """Why the run stops before its next iteration (the target, its iterations, its time budget), or None."""
        if stop := self.target_stop():
            return stop
        if self.state.iterations_done >= self.cfg.iters:
            return f"{self.cfg.iters} iterations done"
        if time.monotonic() > run_end:
            return f"time budget of {self.cfg.budget_seconds:g}s spent"
        return None

    def target_reached(self) -> bool:
        s = self.speedup_vs(self.cfg.baseline)
        return s is not None and s.value >= self.cfg.target

    def target_stop(self) -> str | None:
        """Why the run stops at its target, or None: the target is reached when the confirmation bench
        holds it; a target the initial kernel already meets stops the run before any iteration unless
        the user asked to optimize past it (a 'reached' run that tried nothing would read as a success)."""
        cfg, st = self.cfg, self.state
        if cfg.past_target or not self.target_reached():
            return None
        if st.best_iteration is None and st.iterations_done == 0:
            s = self.speedup_vs(cfg.baseline)
            return (f"the initial kernel already meets the target: {s.text()} vs {cfg.baseline}, target "
                    f"{cfg.target:g}x; nothing was tried (raise --target, or pass --past-target to optimize past it)")
        self.confirm()
        if self.target_reached():
            return f"target {cfg.target:g}x vs {cfg.baseline} reached (confirmed)"
        self.view.message("the target looked reached but the confirmation bench did not hold it; going on")
        return None

    def confirm(self) -> None:
        """Time the best against the initial kernel, interleaved, and against the reference."""
        st = self.state
        if st.confirmed_sha == st.best_sha or st.best_iteration is None:
            if st.best_iteration is None and st.confirmed_sha != st.best_sha:
                # nothing kept: the best is the initial kernel, timed against the reference at setup,
                # interleaved (runs/RUN/initial/bench.json)
                st.confirmed_sha, st.confirmed_vs_initial = st.best_sha, 1.0
                st.confirmed_vs_initial_low = st.confirmed_vs_initial_high = 1.0
                st.confirmed_vs_reference = st.initial_vs_reference
                ci = _setup_reference_ci(self.run_dir)
                st.confirmed_vs_reference_low, st.confirmed_vs_reference_high = (ci.low, ci.high) if ci else (None, None)
            return
        self.view.message("confirming the best against the initial kernel (interleaved) and the reference")
        try:
            b = self.evaluator.bench(self.lib, self.initial_lib, StageTimes(), with_reference=True)[0]
        except IterationEnded as e:
            self.view.message(f"[yellow]confirmation bench failed[/yellow]: {escape(e.reason)}")
            return
        dump(self.run_dir / "confirm.json", b)
        ci = b.speedup_vs_baseline
        st.confirmed_sha = st.best_sha
        st.confirmed_vs_initial = ci.median if ci else None
        st.confirmed_vs_initial_low, st.confirmed_vs_initial_high = (ci.low, ci.high) if ci else (None, None)
        st.confirmed_vs_reference = b.speedup_vs_reference
        rci = b.speedup_vs_reference_ci
        st.confirmed_vs_reference_low, st.confirmed_vs_reference_high = (rci.low, rci.high) if rci else (None, None)
        st.confirmed_ms = {t.label: t.median_ms for t in b.timings
                           if t.label != "reference" or b.speedup_vs_reference is not None}
        self.save()


def _setup_reference_ci(run_dir: Path):
    """The initial kernel's speedup over the reference with its interval, from the setup bench."""
    path = run_dir / "initial" / "bench.json"
    try:
        return BenchResult.model_validate_json(path.read_text()).speedup_vs_reference_ci
    except (OSError, ValueError):
        return None


def dump_results(d: Path, a) -> None:
    """The typed results an attempt (agent/evaluation/attempt.py) holds, as the iteration's artifacts."""
    for res, name in ((a.parity, "parity.json"), (a.bench, "bench.json")):
        if res is not None:
            dump(d / name, res)
    if a.build is not None and a.build.log is not None and not (d / "build.log").exists():
        (d / "build.log").write_text(a.build.log)


def dump(path: Path, model) -> None:
    """A typed result (or plain JSON data) as an artifact of the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=2) if hasattr(model, "model_dump_json") else json.dumps(model))

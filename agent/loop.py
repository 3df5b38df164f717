"""The optimization loop: DESIGN.md "One iteration", steps 1-10.

    context -> proposal -> patch (worktree) -> commit -> build -> launch check -> parity -> bench
            -> keep (amend message with results, trailers) | revert (ref refs/agent/RUN/rejected/N)
            -> profile the new best -> log one record

Its state lives in one place (`Loop`): the best commit, its library, its time and profile. Every
way out of an iteration is an `IterationEnded` with an outcome and a reason. Records are appended
before the next iteration begins; `Loop.resume` continues a run from its log and branch.
"""

from __future__ import annotations

import json
import math
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

from agent import gitops
from agent.attempt import Attempt, KeepRule, decide
from agent.evaluate import (EditOutsideEditable, Evaluator, Implausible, IterationEnded, NoChange, NotFaster,
                            PatchDidNotApply, snapshot_lib)
from agent.proposal import Proposal
from agent.proposers.base import Context, HistoryItem, Proposer, ProposerError
from agent.runlog import (Decision, IterationRecord, LogError, Outcome, RunConfig, RunState, StageTimes,
                          append_iteration, read_config, read_iterations, read_state, write_json_atomic)
from agent.signals import DeferSigint
from agent.view import View
from tools.device import task_limits
from tools.profile.compact import profile_summary
from tools.results import LaunchResult, ParityResult
from tools.task import Task, TaskError, load_task, shape_label

PATCH_REPAIRS = 2            # a patch that does not apply goes back to the proposer at most this often
IMPLAUSIBLE_RATIO = 10.0     # a speedup above this over the parent is re-verified before it is kept


class SetupFailed(Exception):
    """The run cannot start (the initial kernel fails to build or fails parity, ...)."""


def _candidate_ms(r: IterationRecord) -> float | None:
    t = r.bench.timing("candidate") if r.bench is not None else None
    return t.median_ms if t is not None else None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Loop:
    def __init__(self, run_dir: Path, cfg: RunConfig, rgit: gitops.RunGit, proposer: Proposer, view: View):
        self.run_dir, self.cfg, self.git, self.proposer, self.view = run_dir, cfg, rgit, proposer, view
        self.state = read_state(run_dir) if (run_dir / "state.json").exists() else RunState()
        self.task = self._load_task()
        self.best_lib = run_dir / "best" / self._lib_name()
        self.initial_lib = run_dir / "initial" / self._lib_name()
        self.records: list[IterationRecord] = read_iterations(run_dir)
        self.profile = None
        self.best_launch: LaunchResult | None = None
        self.limits = task_limits(self.task)
        self.evaluator = Evaluator(self.task, run_dir / "build", self.limits)
        self.t_start = time.monotonic()
        self._iter_t0: float | None = None     # the iteration under way started (monotonic)
        self._interrupt_after_keep = False
        self._sigint = False

    # --- paths ------------------------------------------------------------------------------
    def _task_dir(self) -> Path:
        return Path(self.cfg.worktree) / self.cfg.task_dir

    def _load_task(self) -> Task:
        return load_task(self._task_dir())

    def reload_task(self) -> None:
        """The task as the worktree has it now (after a commit, a revert or a reset), for the loop and
        its evaluator alike."""
        self.task = self._load_task()
        self.evaluator.task = self.task

    def _lib_name(self) -> str:
        return f"lib{self.cfg.task}.so"

    def _iter_dir(self, i: int) -> Path:
        d = self.run_dir / f"iter-{i}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _rel(self, files: list[str]) -> list[str]:
        return [str(Path(self.cfg.task_dir) / f) for f in files]

    # --- setup: measure the initial kernel --------------------------------------------------
    def measure_initial(self) -> None:
        """Build, check and time the initial kernel (the branch's first commit); its profile seeds iteration 1."""
        times = StageTimes()
        self.view.message(f"[bold]initial kernel[/bold]: build, launch check, parity, bench vs reference "
                          f"({shape_label(self.task.spec.main)})")
        try:
            b = self.evaluator.build(times)
            self.best_launch = self.evaluator.launch(b, None, times)
            snapshot_lib(b.lib_path, self.best_lib)
            snapshot_lib(b.lib_path, self.initial_lib)
            self.evaluator.parity(self.best_lib, times)
            bench = self.evaluator.bench(self.best_lib, None, times, with_reference=True)[0]
        except IterationEnded as e:
            raise SetupFailed(f"the initial kernel cannot be the starting point: {e.reason}") from None
        cand = bench.timing("candidate")
        ref = bench.timing("reference")
        self.state.initial_ms = self.state.best_ms = cand.median_ms if cand else None
        self.state.reference_ms = ref.median_ms if ref else None
        self.state.best_sha = self.git.head()
        self.state.initial_knobs = {k: v for k, v in self.task.read_knobs().items() if v is not None}
        _dump(self.run_dir / "initial" / "bench.json", bench)
        self._profile_best(self.run_dir / "initial")
        write_json_atomic(self.run_dir / "state.json", self.state)
        vs_ref = f", reference {self.state.reference_ms * 1e3:.1f} us" if self.state.reference_ms else ""
        self.view.message(f"initial: {self.state.initial_ms * 1e3:.1f} us{vs_ref}")

    def _profile_best(self, out_dir: Path) -> None:
        if self.task.spec.device != "cuda":
            self.profile = None   # no counters for CPU code; the heuristic explores its knobs
            return
        try:
            from tools.profile import profile_task
        except ImportError:
            self.profile = None
            return
        rep = profile_task(self.task, self.best_lib, tier=self.cfg.profile_tier, out_dir=out_dir)
        _dump(out_dir / "profile.json", rep)
        self.profile = rep if rep.kernels else self.profile

    # --- Ctrl-C ------------------------------------------------------------------------------
    def _on_sigint(self, signum, frame) -> None:
        """A Ctrl-C is remembered as well as raised: a KeyboardInterrupt that lands inside a finalizer
        (GitPython reaps its git processes in __del__, where Python ignores exceptions) is lost, and
        the run went on to the end once (kill-safety suite, SIGINT at parity, under load). The next
        stage boundary raises it again."""
        self._sigint = True
        raise KeyboardInterrupt

    def _stage(self, i: int, stage: str, hypothesis: str | None = None) -> None:
        if self._sigint:
            raise KeyboardInterrupt
        self.view.stage(i, stage, hypothesis)

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> RunState:
        self.view.start(self.cfg, self.state)
        self._sigint = False
        try:
            prev = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:      # not the main thread: Python's default handler stays
            prev = None
        try:
            while True:
                stop = self._stop_reason()
                if stop:
                    self._finish("done", stop)
                    break
                i = self.state.iterations_done + 1
                try:
                    if self._sigint:
                        raise KeyboardInterrupt
                    rec = self.iteration(i)
                except KeyboardInterrupt:
                    self._finish("interrupted", f"interrupted by the user during iteration {i}")
                    break
                except _StopRun as e:
                    self._finish("done", e.reason)
                    break
                self.records.append(rec)
                self.state.iterations_done = i
                self.state.usage = self.state.usage + rec.usage
                write_json_atomic(self.run_dir / "state.json", self.state)
                self.view.done(rec, self.state)
                if self._interrupt_after_keep:   # Ctrl-C arrived during a keep (deferred, see _keep)
                    self._finish("interrupted", f"interrupted by the user; iteration {i} was kept first")
                    break
        finally:
            if prev is not None:
                signal.signal(signal.SIGINT, prev)
            self.view.close()
        return self.state

    def _stop_reason(self) -> str | None:
        if self.target_reached():
            self.confirm()
            if self.target_reached():
                return f"target {self.cfg.target:g}x vs {self.cfg.baseline} reached (confirmed)"
            self.view.message("the target looked reached but the confirmation bench did not hold it; going on")
        if self.state.iterations_done >= self.cfg.iters:
            return f"{self.cfg.iters} iterations done"
        if self.cfg.budget_seconds and time.monotonic() - self.t_start > self.cfg.budget_seconds:
            return f"time budget of {self.cfg.budget_seconds:g}s spent"
        return None

    def speedup_vs(self, which: str) -> float | None:
        """The best's speedup: the confirmed (interleaved) figure where the best was confirmed, else
        an estimate from the best's time and the baseline's time measured at setup."""
        st = self.state
        if st.confirmed_sha and st.confirmed_sha == st.best_sha:
            return st.confirmed_vs_reference if which == "reference" else st.confirmed_vs_initial
        base = st.reference_ms if which == "reference" else st.initial_ms
        if not base or not st.best_ms:
            return None
        return base / st.best_ms

    def confirm(self) -> None:
        """Time the best against the initial kernel, interleaved, and against the reference."""
        st = self.state
        if st.confirmed_sha == st.best_sha or st.best_iteration is None:
            if st.best_iteration is None and st.confirmed_sha != st.best_sha:
                st.confirmed_sha, st.confirmed_vs_initial = st.best_sha, 1.0
                st.confirmed_vs_initial_low = st.confirmed_vs_initial_high = 1.0
                st.confirmed_vs_reference = (st.reference_ms / st.best_ms) if st.reference_ms and st.best_ms else None
            return
        self.view.message("confirming the best against the initial kernel (interleaved) and the reference")
        try:
            b = self.evaluator.bench(self.best_lib, self.initial_lib, StageTimes(), with_reference=True)[0]
        except IterationEnded as e:
            self.view.message(f"[yellow]confirmation bench failed[/yellow]: {e.reason}")
            return
        _dump(self.run_dir / "confirm.json", b)
        ci = b.speedup_vs_baseline
        st.confirmed_sha = st.best_sha
        st.confirmed_vs_initial = ci.median if ci else None
        st.confirmed_vs_initial_low, st.confirmed_vs_initial_high = (ci.low, ci.high) if ci else (None, None)
        st.confirmed_vs_reference = b.speedup_vs_reference
        write_json_atomic(self.run_dir / "state.json", st)

    def target_reached(self) -> bool:
        s = self.speedup_vs(self.cfg.baseline)
        return s is not None and s >= self.cfg.target

    def _finish(self, status: str, reason: str) -> None:
        if status == "done":
            self.confirm()
        self.state.status, self.state.stop_reason, self.state.finished = status, reason, now()
        write_json_atomic(self.run_dir / "state.json", self.state)

    # --- one iteration ----------------------------------------------------------------------
    def iteration(self, i: int) -> IterationRecord:
        d = self._iter_dir(i)
        a = Attempt(iteration=i, run_id=self.cfg.run_id, started=now(), parent_sha=self.state.best_sha or "")
        self._iter_t0 = time.monotonic()
        try:
            proposal, a.patch_message = self._propose_and_patch(i, d, a)
            self._stage(i, "commit", proposal.summary())
            t0 = time.monotonic()
            diff = self.git.diff(self._rel(self.task.spec.editable))
            if not diff.strip():
                raise NoChange("the proposal changes nothing in the editable files")
            a.commit_sha = self.git.commit(self._rel(self.task.spec.editable),
                                           gitops.candidate_message(self.cfg.run_id, i, proposal.hypothesis))
            a.times.git += time.monotonic() - t0
            a.patch = diff
            (d / "patch.diff").write_text(diff)
            self.reload_task()
            self._evaluate(i, d, a)
            # Ctrl-C during a keep is deferred until the kept record is written (verification suite:
            # an interrupt between the state update and the record left state.best_sha on a commit that
            # no record calls kept); SIGKILL there is repaired by prepare_resume
            self._stage(i, "keep")
            with DeferSigint() as sig:
                kept = self._keep(i, d, proposal, a)
            self._interrupt_after_keep = sig.hit
            return kept
        except IterationEnded as e:
            return self._reject(i, d, a, e.outcome, e.reason, e.result)
        except ProposerError as e:   # not one that ends the run (_propose_and_patch): this iteration is lost
            if a.proposal is None:
                a.proposal_error = f"proposer: {e}"
            return self._reject(i, d, a, Outcome.proposal_failed, f"proposer: {e}")
        except KeyboardInterrupt:
            rec_i = self._reject(i, d, a, Outcome.interrupted, "interrupted by the user; candidate reverted",
                                 decision=Decision.interrupted)
            self.records.append(rec_i)
            self.state.iterations_done = i
            write_json_atomic(self.run_dir / "state.json", self.state)
            raise

    def _propose_and_patch(self, i: int, d: Path, a: Attempt) -> tuple[Proposal, str]:
        from agent.patch import PatchStatus, apply_edits
        feedback, kind = self._last_failure()
        for attempt in range(PATCH_REPAIRS + 1):
            self._stage(i, "propose")
            ctx = self._context(i, d, feedback, kind)
            t0 = time.monotonic()
            try:
                proposal, u = self.proposer.propose(ctx)
            except ProposerError as e:
                a.usage = a.usage + e.usage
                if e.ends_run:
                    raise _StopRun(str(e)) from None
                raise
            finally:
                a.times.propose += time.monotonic() - t0
            a.usage = a.usage + u
            proposal.proposer = proposal.proposer or self.proposer.name
            # in the record at once: an interrupt or a refused patch still says what was proposed
            # (and a resumed replay counts it as consumed)
            a.proposal = proposal
            (d / f"proposal-{attempt}.json" if attempt else d / "proposal.json").write_text(proposal.model_dump_json(indent=2))
            t0 = time.monotonic()
            res = apply_edits(proposal.edits, self._task_dir(), self.task.spec.editable)
            a.times.patch += time.monotonic() - t0
            broken = _task_error(self._task_dir()) if res.ok else None
            if res.ok and broken is None:
                return proposal, res.message
            self.git.reset_to(self.state.best_sha)   # all-or-nothing, but never trust a half state
            if broken is not None:
                # verification suite: a rewrite that drops a knob's #define made the task unloadable and
                # ended the whole run; now it is a patch that does not apply, with the reason
                feedback, kind = f"Your edit breaks the task: {broken}", "patch_did_not_apply"
                if attempt == PATCH_REPAIRS or not self.proposer.can_repair:
                    raise PatchDidNotApply(f"the edit breaks the task: {broken}")
                continue
            if res.status == PatchStatus.outside_editable:
                raise EditOutsideEditable(res.message)
            if res.status == PatchStatus.no_change:
                raise NoChange(res.message)
            feedback, kind = f"Your patch did not apply:\n{res.message}", res.status.value
            if attempt == PATCH_REPAIRS or not self.proposer.can_repair:
                raise PatchDidNotApply(res.message)
        raise AssertionError("unreachable")

    def _last_failure(self) -> tuple[str | None, str | None]:
        """A candidate that failed to compile, launch or match the reference: the proposer sees why."""
        if not self.records:
            return None, None
        r = self.records[-1]
        if r.outcome in (Outcome.compile_failed, Outcome.parity_failed, Outcome.launch_rejected):
            hyp = r.proposal.summary() if r.proposal else "the last candidate"
            return f"Iteration {r.iteration} ({hyp}) was rejected: {r.reason}", r.outcome.value
        return None, None

    def _context(self, i: int, d: Path, feedback: str | None, kind: str | None = None) -> Context:
        sources = {f: self.task.path(f).read_text() for f in self.task.spec.editable}
        history = [HistoryItem(iteration=r.iteration, hypothesis=r.proposal.hypothesis if r.proposal else "-",
                               outcome=r.outcome.value, reason=r.reason, speedup=r.speedup_vs_best,
                               knobs=r.proposal.knobs if r.proposal else None, ms=_candidate_ms(r))
                   for r in self.records]
        return Context(task=self.task, iteration=i, sources=sources, profile=self.profile, history=history,
                       best_ms=self.state.best_ms, reference_ms=self.state.reference_ms,
                       knobs=self.task.read_knobs(), measured_knobs=[self.state.initial_knobs],
                       feedback=feedback, feedback_kind=kind, iter_dir=str(d))

    def _evaluate(self, i: int, d: Path, a: Attempt) -> None:
        """Build, then launch check + parity + bench in one child, then what decide() asks for."""
        self._stage(i, "build")
        warm = self.evaluator.prestart()   # the evaluate child starts up while nvcc runs
        try:
            a.build = self.evaluator.build(a.times)
            (d / "build.log").write_text(a.build.log)
            lib = snapshot_lib(a.build.lib_path, d / self._lib_name())
            # the static launch check, parity and the bench, in one child (a failed launch check runs nothing)
            self._stage(i, "check+bench")
            self.evaluator.check_candidate(a.build, lib, self.best_lib, self.best_launch, a.times, a, warm=warm)
        finally:
            if warm is not None:
                warm.close()
            for res, name in ((a.parity, "parity.json"), (a.bench, "bench.json")):
                if res is not None:
                    _dump(d / name, res)
        rule = KeepRule(min_gain=self.cfg.min_gain, implausible=IMPLAUSIBLE_RATIO)
        v = decide(a, rule)
        if v.action == "confirm":
            self._stage(i, "confirm")
            self._confirm(lib, a, reparity=v.reparity)
            v = decide(a, rule)
        if v.action == "reject":
            raise (Implausible if v.outcome == Outcome.implausible else NotFaster)(v.reason, a.confirm)
        # about to be kept: the real launch geometry (profiler trace) must match the plan and the limits
        self._stage(i, "launch")
        a.launch = self.evaluator.verify_launch(lib, a.launch, a.times)

    def _confirm(self, lib: Path, a: Attempt, reparity: bool) -> None:
        """The second, independent interleaved bench (a fresh process) that a gain must survive, after
        a parity on fresh seeds where the gain is implausible; fills a.confirm or a.confirm_error."""
        try:
            if reparity:
                self.evaluator.parity(lib, a.times, seed=int(time.time()) % 100000 + 7)
            a.confirm = self.evaluator.bench(lib, self.best_lib, a.times)[0]
        except IterationEnded as e:
            if isinstance(e.result, list) and e.result:
                a.confirm = e.result[0]
            a.confirm_error = e.reason
            return
        _dump(self._iter_dir(a.iteration) / "confirm-bench.json", a.confirm)

    def _keep(self, i: int, d: Path, proposal: Proposal, a: Attempt) -> IterationRecord:
        bench = a.bench
        ci = bench.speedup_vs_baseline
        cand = bench.timing("candidate")
        self.state.best_ms = cand.median_ms
        vs_init, vs_ref = self.speedup_vs("initial"), self.speedup_vs("reference")
        parity: ParityResult = a.parity
        max_err = max((c.max_abs_err or 0.0) for c in parity.checks) if parity.checks else 0.0
        again = a.confirm.speedup_vs_baseline if a.confirm is not None else None
        body = [proposal.hypothesis, "",
                f"Measured on {shape_label(bench.shape)}: {cand.median_ms * 1e3:.2f} us median "
                f"(p10 {cand.p10_ms * 1e3:.2f}, p90 {cand.p90_ms * 1e3:.2f}); "
                f"{ci.median:.3f}x over the parent (95% CI {ci.low:.3f}-{ci.high:.3f}, {ci.rounds} ABAB rounds)"
                + (f"; confirmed by a second bench at {again.median:.3f}x (95% CI {again.low:.3f}-{again.high:.3f})."
                   if again else "."),
                f"Cumulative: {_x(vs_init)} vs the initial kernel, {_x(vs_ref)} vs the reference.",
                f"Parity: {len(parity.checks)} checks, max abs error {max_err:.3g}.",
                f"Predicted: {proposal.predicted.metric} {proposal.predicted.direction}, "
                f"{proposal.predicted.speedup:g}x."]
        t0 = time.monotonic()
        sha = self.git.amend_message(gitops.kept_message(self.cfg.run_id, i, proposal.summary(), body,
                                                         f"{ci.median:.3f}x (95% CI {ci.low:.3f}-{ci.high:.3f})"))
        a.times.git += time.monotonic() - t0
        snapshot_lib(d / self._lib_name(), self.best_lib)
        self.state.best_sha, self.state.best_iteration = sha, i
        self.best_launch = a.launch
        self._stage(i, "profile")
        t0 = time.monotonic()
        self._profile_best(d)
        a.times.profile += time.monotonic() - t0
        a.profile_summary = profile_summary(self.profile) if self.task.spec.device == "cuda" else None
        a.commit_sha = sha
        return self._record(a, Decision.kept, Outcome.kept, f"kept: {ci.median:.3f}x over the parent",
                            speedup_vs_best=ci.median)

    def _reject(self, i: int, d: Path, a: Attempt, outcome: Outcome, reason: str, failed=None,
                decision: Decision | None = None) -> IterationRecord:
        """Revert the candidate (its commit stays reviewable under a rejected ref) and record why;
        `failed` is the typed result of the stage that failed, if it raised one."""
        t0 = time.monotonic()
        commit_sha = a.commit_sha
        if commit_sha is not None:
            rejected_sha = commit_sha
            try:
                if self.git.head() == commit_sha:
                    rejected_sha = self.git.amend_message(gitops.rejected_message(
                        self.cfg.run_id, i, a.proposal.summary() if a.proposal else "candidate",
                        a.proposal.hypothesis if a.proposal else "", reason))
            finally:
                a.rejected_ref = self.git.keep_ref("rejected", i, rejected_sha)
                a.commit_sha = rejected_sha
        self.git.reset_to(self.state.best_sha)
        a.times.git += time.monotonic() - t0
        self.reload_task()
        _keep_failed_result(d, outcome, failed, a)
        if decision is None:
            decision = Decision.reverted if commit_sha is not None else Decision.skipped
        s = a.bench.speedup_vs_baseline.median if a.bench is not None and a.bench.speedup_vs_baseline else None
        return self._record(a, decision, outcome, reason, speedup_vs_best=s)

    def _record(self, a: Attempt, decision: Decision, outcome: Outcome, reason: str,
                speedup_vs_best: float | None = None) -> IterationRecord:
        r = IterationRecord(**{k: getattr(a, k) for k in _RECORDED}, finished=now(), decision=decision,
                            outcome=outcome, reason=reason,
                            wall_s=time.monotonic() - self._iter_t0 if self._iter_t0 is not None else None,
                            speedup_vs_best=speedup_vs_best, speedup_vs_initial=self.speedup_vs("initial"),
                            speedup_vs_reference=self.speedup_vs("reference"), best_ms=self.state.best_ms)
        append_iteration(self.run_dir, r)
        return r

class _StopRun(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# The typed result of the stage that failed goes into the record and its artifact (verification suite:
# the log must show WHICH check rejected a candidate - rec.parity.status, rec.bench.message, ...).
_FAILED_STAGE = {Outcome.compile_failed: ("build", None), Outcome.launch_rejected: ("launch", None),
                 Outcome.parity_failed: ("parity", "parity.json"), Outcome.bench_failed: ("bench", "bench.json")}


def _keep_failed_result(d: Path, outcome: Outcome, failed, a: Attempt) -> None:
    field, artifact = _FAILED_STAGE.get(outcome, (None, None))
    res = failed[0] if isinstance(failed, list) and failed else failed
    if field is None or res is None or getattr(a, field) is not None:
        return
    setattr(a, field, res)
    if artifact:
        _dump(d / artifact, res)
    elif field == "build" and getattr(res, "log", None) is not None:
        (d / "build.log").write_text(res.log)


# the Attempt's fields that the iteration record carries as they are (the rest the loop adds)
_RECORDED = ("run_id", "iteration", "started", "proposal", "proposal_error", "patch", "patch_message", "parent_sha",
             "commit_sha", "rejected_ref", "build", "launch", "parity", "bench", "confirm", "profile_summary",
             "times", "usage")


def _task_error(task_dir: Path) -> str | None:
    """Why the patched task no longer loads (e.g. a knob's #define removed), or None."""
    try:
        load_task(task_dir)
    except TaskError as e:
        return f"{e.field}: {e.message}"
    return None


def _dump(path: Path, model) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=2) if hasattr(model, "model_dump_json") else json.dumps(model))


def _x(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None and math.isfinite(v) else "n/a"


def load_run(run_dir: Path) -> tuple[RunConfig, RunState]:
    cfg = read_config(run_dir)
    st = read_state(run_dir)
    if st.status == "unknown":
        raise LogError(f"{run_dir}: no state.json; the run never measured its initial kernel")
    return cfg, st

"""The optimization loop: DESIGN.md "One iteration", steps 1-10.

    context -> proposal -> patch (worktree) -> commit -> build -> launch check -> parity -> bench
            -> decide: keep (amend message with results, trailers) | revert (ref refs/agent/RUN/rejected/N)
            -> profile the new best -> log one record

The best lives in `Best`; an iteration's candidate in an `Attempt` each stage fills and `decide` reads; every way out
is an `IterationEnded` (outcome, reason, the stage's result); a repairable one goes back to the model (agent/optimize/repair.py);
--candidates K: agent/optimize/candidates.py. session.prepare_resume continues a run from its log and branch.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from agent.optimize import gitops
from agent.evaluation.attempt import Attempt, KeepRule, decide
from agent.optimize.best import Best, dump, dump_results
from agent.optimize.candidates import Candidates
from agent.evaluation.ended import Implausible, Inconclusive, IterationEnded, NoChange, NotFaster
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.evaluation.keep import launch_and_confirm
from agent.optimize.propose import StopRun, context, last_failure, propose_and_apply
from agent.proposers.base import Proposer, ProposerError
from agent.optimize.repair import feedback, repairable, set_aside
from agent.optimize.revoke import Pending, settle, settled_parent, stop_reason
from agent.records.schema import Decision, IterationRecord, Outcome, RunConfig, RunState, now
from agent.records.store import append_iteration, read_iterations, read_state
from agent.optimize.signals import DeferSigint
from agent.optimize.view import View
from tools.isolation import scratch
from tools.backends.device import task_limits
from tools.profile.compact import profile_summary
from tools.task import load_task

IMPLAUSIBLE_RATIO = 10.0     # a speedup above this over the parent is re-verified before it is kept


class Loop:
    def __init__(self, run_dir: Path, cfg: RunConfig, rgit: gitops.RunGit, proposer: Proposer, view: View):
        self.run_dir, self.cfg, self.git, self.proposer, self.view = run_dir, cfg, rgit, proposer, view
        self.state = read_state(run_dir) if (run_dir / "state.json").exists() else RunState()
        self.task = load_task(self.task_dir())
        self.records: list[IterationRecord] = read_iterations(run_dir)
        user = rgit.repo.working_tree_dir     # its file modes are watched around each candidate child
        self.evaluator = Evaluator(self.task, run_dir / "build", task_limits(self.task), checkout=user)
        self.best = Best(run_dir, cfg, self.state, self.evaluator, view)
        self.run_end = time.monotonic() + (cfg.budget_seconds or float("inf"))   # --budget-seconds; caps a model call
        self._iter_t0: float | None = None     # the iteration under way started (monotonic)
        self._interrupt_after_keep = self._sigint = False
        self._k: Candidates | None = None    # --candidates K (agent/optimize/candidates.py), made on first use
        self._pending: Pending | None = None     # the last keep's checks, run after it (agent/optimize/revoke.py)

    def task_dir(self) -> Path:
        return Path(self.cfg.worktree) / self.cfg.task_dir

    def reload_task(self) -> None:
        """The task as the worktree has it now (after a commit, a revert or a reset), for loop and evaluator alike."""
        self.task = self.evaluator.task = load_task(self.task_dir())

    def _iter_dir(self, i: int) -> Path:
        (d := self.run_dir / f"iter-{i}").mkdir(parents=True, exist_ok=True)
        return d

    def _rel(self, files: list[str]) -> list[str]:
        return [str(Path(self.cfg.task_dir) / f) for f in files]

    def _on_sigint(self, signum, frame) -> None:
        """A Ctrl-C is remembered as well as raised: one landing in a finalizer (GitPython's __del__) is lost there."""
        self._sigint = True
        raise KeyboardInterrupt

    def stage(self, i: int, stage: str, hypothesis: str | None = None) -> None:
        if self._sigint:
            raise KeyboardInterrupt
        # the card idle while the model writes, nvcc runs: a keep's child warms (spares.py)
        self.evaluator.spare.idle(stage.startswith(("propose", "commit", "build")))
        self.view.stage(i, stage, hypothesis)

    def run(self) -> RunState:
        self.view.start(self.cfg, self.state)
        self._sigint = False
        try:
            prev = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:      # not the main thread: Python's default handler stays
            prev = None
        try:
            while True:
                stop = stop_reason(self)   # the last keep's checks first (revoke.py)
                if stop:
                    self.finish("done", stop)
                    break
                i = self.state.iterations_done + 1
                try:
                    if self._sigint:
                        raise KeyboardInterrupt
                    rec = self.iteration(i)
                except KeyboardInterrupt:
                    self.finish("interrupted", f"interrupted by the user during iteration {i}")
                    break
                except StopRun as e:
                    self.finish("done", e.reason)
                    break
                with DeferSigint() as held:   # recorded: its bookkeeping is not cut (a Ctrl-C here escaped as a signal)
                    self.records.append(rec)
                    self.state.iterations_done = i
                    self.state.usage = self.state.usage + rec.usage
                    self.best.save()
                    self.view.done(rec, self.state)
                if self._interrupt_after_keep or held.hit:   # a Ctrl-C deferred during the keep or the bookkeeping
                    self.finish("interrupted", f"interrupted by the user; iteration {i} was {rec.decision.value} first")
                    break
        finally:
            if prev is not None:
                signal.signal(signal.SIGINT, prev)
            if self._k is not None:
                self._k.ex.close()
            settle(self, wait=False)     # an error ended the run: the last keep's checks are no longer waited for
            self.evaluator.spare.close()
            self.view.close()
        return self.state

    def finish(self, status: str, reason: str) -> None:
        if (gone := settle(self)) is not None:
            reason += f"; then iteration {gone.iteration}'s keep was revoked: {gone.reason}"
        if status == "done":
            self.best.confirm()
        self.state.status, self.state.stop_reason, self.state.finished = status, reason, now()
        self.best.save()

    def iteration(self, i: int) -> IterationRecord:
        d = self._iter_dir(i)
        a = Attempt(iteration=i, run_id=self.cfg.run_id, started=now(), parent_sha=self.state.best_sha or "")
        scratch.drain()     # what the setup's or the last confirmation's processes left is not this candidate's
        self._iter_t0 = time.monotonic()
        try:
            self._attempts(i, d, a)
            # Ctrl-C during a keep waits for the kept record (else state.best_sha could name a commit no record
            # calls kept); a SIGKILL there is repaired by session.prepare_resume
            self.stage(i, "keep")
            with DeferSigint() as sig:
                was = Pending.before(self, i, d, a)
                kept = self._keep(i, d, a)
                self._pending = Pending.start(self, kept, d, *was)
            self._interrupt_after_keep = sig.hit
            return kept
        except IterationEnded as e:
            if e.fill(a):
                dump_results(d, a)
            return self._reject(i, a, e.outcome, e.reason)
        except ProposerError as e:   # not one that ends the run (propose_and_apply): this iteration is lost
            a.proposal_error = a.proposal_error if a.proposal is not None else f"proposer: {e}"
            return self._reject(i, a, Outcome.proposal_failed, f"proposer: {e}")
        except KeyboardInterrupt:
            rec_i = self._reject(i, a, Outcome.interrupted, "interrupted by the user; candidate reverted",
                                 decision=Decision.interrupted)
            self.records.append(rec_i)
            self.state.iterations_done = i
            self.best.save()
            raise

    def _attempts(self, i: int, d: Path, a: Attempt) -> None:
        """Propose, commit, evaluate; a failure the model can repair goes back to it in the same conversation, at most
        cfg.repairs times (agent/optimize/repair.py): the iteration's verdict is its last attempt's."""
        if self.cfg.candidates > 1:   # K proposals, each on a worker; the fastest that passed goes on (agent/optimize/candidates.py)
            self._k = self._k or Candidates.for_loop(self)
            return self._k.settle(i, d, a, self._settle)   # the fastest that passed; where it fails, the next
        fb, left = last_failure(self.records), (self.cfg.repairs if self.proposer.can_repair else 0)
        while True:
            before, t0 = a.usage, time.monotonic()
            try:
                proposal, a.patch_message = propose_and_apply(
                    self.proposer, lambda text, kind: context(self.task, i, d, self.records, self.state,
                                                              self.best.profile, text, kind, self.run_end),
                    self.task_dir(), self.task.spec.editable, lambda: self.git.reset_to(self.state.best_sha),
                    lambda: self.stage(i, "propose"), fb, a, d, ready=lambda: settled_parent(self, a))
                self.stage(i, "commit", proposal.summary())
                self.commit(d, a)
                return self._evaluate(i, d, a)
            except IterationEnded as e:
                if left <= 0 or not repairable(e):
                    raise
                left -= 1
                e.fill(a)
                fb = (feedback(e, a, self.task_dir()), e.outcome.value)
                self._revert(i, a, e.reason, f"{i}.{len(a.attempts) + 1}")
                set_aside(a, e, a.rejected_ref, before, time.monotonic() - t0)

    def commit(self, d: Path, a: Attempt) -> None:
        t0 = time.monotonic()
        diff = self.git.diff(self._rel(self.task.spec.editable))
        if not diff.strip():
            raise NoChange("the proposal changes nothing in the editable files")
        a.commit_sha = self.git.commit(self._rel(self.task.spec.editable),
                                       gitops.candidate_message(self.cfg.run_id, a.iteration, a.proposal.hypothesis))
        a.times.git += time.monotonic() - t0
        a.patch = diff
        (d / "patch.diff").write_text(diff)
        self.reload_task()

    def _evaluate(self, i: int, d: Path, a: Attempt) -> None:
        """Build, then launch check + parity + bench in one child, then what decide() asks for."""
        self.stage(i, "build")
        warm = self.evaluator.prestart()   # the evaluate child starts up while nvcc runs
        try:
            a.build = self.evaluator.build(a.times)
            (d / "build.log").write_text(a.build.log)
            lib = snapshot_lib(a.build.lib_path, d / self.best.lib.name)
            # the static launch check, parity and the bench, in one child (a failed launch check runs nothing)
            self.stage(i, "check+bench")
            self.evaluator.evaluate_candidate(lib, self.best.lib, a.times, into=a, warm=warm, parity_extent="quick",
                                              launch_context=self.evaluator.launch_context(a.build, self.best.launch))
        finally:
            if warm is not None:
                warm.close()
            dump_results(d, a)
        self._settle(i, a, lib)

    def _settle(self, i: int, a: Attempt, lib: Path) -> None:
        """What decide() asks for after the first bench: re-benches; the confirmation, then the real launch geometry
        (agent/evaluation/keep.py: the confirmation's child and sanitizer hosts, held from before the keep)."""
        v = decide(a, rule := KeepRule(min_gain=self.cfg.min_gain, implausible=IMPLAUSIBLE_RATIO))
        save = lambda name, res: dump(self._iter_dir(a.iteration) / name, res)   # noqa: E731
        profile, launched = (self._iter_dir(a.iteration), self.cfg.profile_tier), False
        while v.action in ("confirm", "rebench"):   # decide() bounds both: one confirmation, REBENCH_MAX re-benches
            if v.action == "confirm":
                launched = launch_and_confirm(self.evaluator, lib, self.best.lib, a, v.reparity, save, profile,
                                              lambda name: self.stage(i, name),
                                              lambda at: decide(at, rule).action != "reject")
            else:
                self.stage(i, "rebench")
                self.evaluator.rebench(lib, self.best.lib, a, v, save)
            v = decide(a, rule)
        if v.action == "reject":
            self.best.profile_rejected(lib, self._iter_dir(a.iteration), a, v.outcome, self.run_end)
            raise {Outcome.implausible: Implausible, Outcome.inconclusive: Inconclusive}.get(v.outcome, NotFaster)(
                v.reason)
        if not launched:      # decide() keeps only after a confirmation; should that change, no keep goes unchecked
            self.stage(i, "launch")
            a.launch = self.evaluator.verify_launch(lib, a.launch, a.times, profile=profile)

    def _keep(self, i: int, d: Path, a: Attempt) -> IterationRecord:
        ci = a.bench.speedup_vs_baseline
        t0 = time.monotonic()
        sha = self.git.amend_message(gitops.kept_message(self.cfg.run_id, a, self.best.advance(a.bench)))
        a.times.git += time.monotonic() - t0
        snapshot_lib(d / self.best.lib.name, self.best.lib)
        self.state.best_sha, self.state.best_iteration = sha, i
        self.best.side_by_side(a.confirm, sha)
        self.best.launch = a.launch
        self.stage(i, "profile")
        t0 = time.monotonic()
        self.best.reprofile(d, taken=self.evaluator.take_profile(d / self.best.lib.name))
        a.times.profile += time.monotonic() - t0
        a.profile_summary = profile_summary(self.best.profile) if self.task.backend.gpu else None
        a.commit_sha = sha
        return self._record(a, Decision.kept, Outcome.kept, f"kept: {ci.median:.3f}x over the parent",
                            speedup_vs_best=ci.median)

    def _reject(self, i: int, a: Attempt, outcome: Outcome, reason: str,
                decision: Decision | None = None) -> IterationRecord:
        """Revert the candidate (its commit stays reviewable under a rejected ref) and record why."""
        commit_sha = self._revert(i, a, reason, i)
        decision = decision or (Decision.reverted if commit_sha is not None else Decision.skipped)
        s = a.bench.speedup_vs_baseline.median if a.bench is not None and a.bench.speedup_vs_baseline else None
        return self._record(a, decision, outcome, reason, speedup_vs_best=s)

    def _revert(self, i: int, a: Attempt, reason: str, ref: int | str) -> str | None:
        """Its commit (returned) under refs/agent/RUN/rejected/REF, saying why; the branch back at the best."""
        t0 = time.monotonic()
        if (commit_sha := a.commit_sha) is not None:
            rejected_sha = commit_sha
            try:
                if self.git.head() == commit_sha:
                    rejected_sha = self.git.amend_message(gitops.rejected_message(
                        self.cfg.run_id, i, a.proposal.summary() if a.proposal else "candidate",
                        a.proposal.hypothesis if a.proposal else "", reason))
            finally:
                a.rejected_ref = self.git.keep_ref("rejected", ref, rejected_sha)
                a.commit_sha = rejected_sha
        self.git.reset_to(self.state.best_sha)
        a.times.git += time.monotonic() - t0
        self.reload_task()
        return commit_sha

    def _record(self, a: Attempt, decision: Decision, outcome: Outcome, reason: str,
                speedup_vs_best: float | None = None) -> IterationRecord:
        a.scratch_files = scratch.drain()
        vi, vr = (getattr(self.best.speedup_vs(w), "value", None) for w in ("initial", "reference"))
        r = a.to_record(finished=now(), decision=decision, outcome=outcome, reason=reason,
                        wall_s=time.monotonic() - self._iter_t0 if self._iter_t0 is not None else None,
                        speedup_vs_best=speedup_vs_best, speedup_vs_initial=vi, speedup_vs_reference=vr,
                        best_ms=self.state.best_ms)
        append_iteration(self.run_dir, r)
        return r

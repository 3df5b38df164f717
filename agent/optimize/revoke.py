"""A kept iteration revoked: a check run after its keep (tools/judge/later.py) refused its kernel (issue 66, slice
18). The steps, their order and why: agent/records/revoked.py; the records' side (the rewritten record, the state
before the keep) is there too.

The loop's side (Pending): where its Evaluator's confirmation left sanitizers for after the keep (`later`, on a GPU:
racecheck, whose hold on the card slowed the confirmation's parity by 2-3 s; the default: AGENT_RACECHECK_LATER=0
keeps it beside parity), they start as the keep ends, on the kept library, in a judge child of their own, and run
while the model proposes the next candidate. They are waited for before its edits are applied (settled_parent) and
before the run ends. Clean, the kept record is rewritten with their results. Refused (or not run, where
AGENT_ALLOW_UNCHECKED does not name the check), the keep is revoked: the record, the state, the branch, the best's
library, launch and profile go back to what the keep found, and the proposal is applied to that best instead (a
replayed or scripted proposal applies as it would have; a model's, written against the revoked code, may not,
and goes back to it as a patch that did not apply). A run killed while they run leaves its kept record naming
them in parity.later with no result for them; `agent resume` runs them (unchecked_best). Their refusal is kept in the
iteration's folder (REFUSED) before the revocation: one that an error or a kill cut short, resume finishes from it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from agent.optimize.gitops import revoked_message
from agent.optimize.signals import DeferSigint
from agent.records.revoked import BEST_FIELDS, restored, revoked_record, save_before, state_before
from agent.records.schema import Decision, IterationRecord, RunState
from agent.records.store import rewrite_iteration, write_json_atomic
from pydantic import BaseModel
from tools.judge.later import Later
from tools.judge.sanitize import allowed_unchecked
from tools.results import SanitizerResult

LATER_ENV = "AGENT_RACECHECK_LATER"   # not "0": the loop's confirmations leave racecheck for after the keep
LIB_BEFORE = "best-before"     # the best's library as the keep found it, in the kept iteration's folder
REFUSED = "later-refused.json"  # the checks' results that refused the keep, kept before it is revoked


def revoke(run_dir: Path, rgit, rec: IterationRecord, now: RunState, before: RunState,
           found: list[SanitizerResult]) -> tuple[IterationRecord, RunState]:
    """Steps 1-4 of the module docstring; returns the rewritten record and the state written. `rec` is the kept
    record of the state's best (`now.best_iteration`); `before` the state its keep found."""
    if now.best_iteration != rec.iteration or rec.decision != Decision.kept or not rec.commit_sha:
        raise ValueError(f"iteration {rec.iteration} is not the run's kept best (the best is "
                         f"{now.best_iteration}): only the last keep can be revoked")
    new_rec = revoked_record(rec, found, "", "")
    kept = rgit.repo.commit(rec.commit_sha).message
    sha = rgit.copy_commit(rec.commit_sha, revoked_message(rec.run_id, rec.iteration, kept, new_rec.reason))
    ref = rgit.keep_ref("revoked", rec.iteration, sha)
    new_rec = new_rec.model_copy(update={"commit_sha": sha, "rejected_ref": ref})
    rewrite_iteration(run_dir, new_rec)
    state = restored(now, before)
    write_json_atomic(run_dir / "state.json", state)
    rgit.reset_to(state.best_sha)
    return new_rec, state


class Refusal(BaseModel):
    """The checks' results that refused a keep (REFUSED), kept before its revocation."""
    sanitizers: list[SanitizerResult]


class Answered:
    """Checks that have answered (a Refusal read back by unchecked_best): what Pending reads of a Later."""
    done = True

    def __init__(self, found: list[SanitizerResult]):
        self.found, self.checks = list(found), tuple(r.tool for r in found)

    def results(self) -> list[SanitizerResult]:
        return list(self.found)

    def close(self) -> None:
        pass


class Pending:
    """The checks after keep `rec` (module docstring), running."""

    def __init__(self, rec: IterationRecord, d: Path, later: Later, launch, profile):
        self.rec, self.d, self.later, self.launch, self.profile = rec, d, later, launch, profile

    @staticmethod
    def before(loop, i: int, d: Path, a) -> tuple:
        """As a keep of iteration `i` begins: the state and the best's library it finds, and the parity that names
        the checks left for later (what rebuilds the record from its commit after a kill reads: recover.py), kept in
        its folder `d`; the best's launch and profile it finds, returned (for start)."""
        if not loop.evaluator.later:      # nothing runs after this keep: nothing to go back to
            return loop.best.launch, loop.best.profile
        if a.parity is not None:
            write_json_atomic(d / "parity.json", a.parity)
        save_before(loop.run_dir, i, loop.state)
        if loop.best.lib.exists():
            shutil.copy2(loop.best.lib, d / LIB_BEFORE)
        return loop.best.launch, loop.best.profile

    @classmethod
    def start(cls, loop, rec: IterationRecord, d: Path, launch, profile) -> "Pending | None":
        """The checks the kept record's confirmation left for later, started on its library; None where none."""
        checks = tuple(rec.parity.later) if rec.parity is not None else ()
        lib = d / loop.best.lib.name
        if not checks or not lib.exists():
            return None
        ev = loop.evaluator
        later = Later(loop.task, lib, checks, ev.scratch_root, held=ev.spare.take_later())   # hosts started earlier
        ev.spare.ensure_later(ev)     # the next keep's, its start-up while the next candidate is proposed (spares.py)
        return cls(rec, d, later, launch, profile)

    def settle(self, loop) -> IterationRecord | None:
        """Waits for the checks; the kept record rewritten with their results, or the keep revoked (returned)."""
        if not self.later.done:     # said: a Ctrl-C here leaves them to `agent resume` (unchecked_best)
            loop.view.message(f"waiting for iteration {self.rec.iteration}'s {', '.join(self.later.checks)} after its "
                              "keep (Ctrl-C leaves it for `agent resume`)")
        found, allowed = self.later.results(), allowed_unchecked()
        bad = [r for r in found if r.status == "failed" or (r.status != "ok" and r.tool not in allowed)]
        rec = next((r for r in loop.records if r.iteration == self.rec.iteration), self.rec)   # as the log has it
        if not bad:
            par = rec.parity.model_copy(update={**{r.tool: r for r in found},
                                                "message": f"{rec.parity.message}: "
                                                           + "; ".join(r.message for r in found)})
            new = rec.model_copy(update={"parity": par})
            rewrite_iteration(loop.run_dir, new)
            loop.records = [new if r.iteration == new.iteration else r for r in loop.records]
            return None
        # kept first: a revocation that fails (a git lock) or is killed leaves the refusal for `agent resume`
        write_json_atomic(self.d / REFUSED, Refusal(sanitizers=found))
        before = state_before(loop.run_dir, rec, loop.records, loop.state)
        with DeferSigint():     # a Ctrl-C here would leave the loop's best the revoked one while state.json is not
            new, state = revoke(loop.run_dir, loop.git, rec, loop.state.model_copy(), before, found)
            for k in BEST_FIELDS:     # the loop's state object is the one Best holds: changed in place
                setattr(loop.state, k, getattr(state, k))
            if (self.d / LIB_BEFORE).exists():
                shutil.copy2(self.d / LIB_BEFORE, loop.best.lib)
            loop.best.launch, loop.best.profile = self.launch, self.profile
            loop.records = [new if r.iteration == new.iteration else r for r in loop.records]
        loop.reload_task()
        loop.view.message(f"iteration {rec.iteration}'s keep revoked: {new.reason}")
        return new

    def close(self) -> None:
        self.later.close()


def settle(loop, wait: bool = True) -> IterationRecord | None:
    """The loop's last keep's checks (loop._pending) waited for and settled: the record of the keep they revoked, or
    None. Not `wait`: ended where they are (the run ended on an error)."""
    pending, loop._pending = loop._pending, None
    if pending is None:
        return None
    if not wait:
        pending.close()
        return None
    try:
        return pending.settle(loop)
    except BaseException:     # a Ctrl-C while it waits, an error: the child ended; its record still names the check
        pending.close()       # in parity.later with no result, which `agent resume` runs again (unchecked_best)
        raise


def settled_parent(loop, a) -> None:
    """Before attempt `a`'s edits are applied: the last keep's checks settled; where they revoked it, the attempt's
    parent is the best they went back to, and the wait is in its times (`later`)."""
    if loop._pending is None:
        return
    t0 = time.monotonic()
    try:
        if settle(loop) is not None:
            a.parent_sha = loop.state.best_sha or ""
            loop.view.message(f"the proposal goes onto iteration {loop.state.best_iteration or 0}'s best (the initial "
                              "kernel where 0) instead")
    finally:
        a.times.later += time.monotonic() - t0


def stop_reason(loop) -> str | None:
    """Best.stop_reason, the last keep's checks settled first where the run may stop there: its target looks reached
    (the confirmation bench then times the best alone, and a revoked best is not the one that reached it), or its
    iterations or its time are spent."""
    if loop._pending is not None and ((not loop.cfg.past_target and loop.best.target_reached())
                                      or loop.state.iterations_done >= loop.cfg.iters
                                      or time.monotonic() > loop.run_end):
        settle(loop)
    return loop.best.stop_reason(loop.run_end)


def unchecked_best(loop) -> Pending | None:
    """`agent resume`: the kept best's checks left for after its keep, where none answered (the run was killed while
    they ran), started again on its library (prepare_resume settles them before the run goes on); else None."""
    rec = next((r for r in loop.records if r.iteration == loop.state.best_iteration), None)
    if rec is None or rec.decision != Decision.kept or rec.parity is None:
        return None
    todo = [c for c in rec.parity.later if getattr(rec.parity, c, None) is None]
    d = loop.run_dir / f"iter-{rec.iteration}"
    if todo and (d / REFUSED).exists():    # they answered and refused it; the revocation did not end: done now
        try:
            found = Answered(Refusal.model_validate_json((d / REFUSED).read_text()).sanitizers)
            if set(todo) <= set(found.checks):
                return Pending(rec, d, found, None, None)
        except ValueError:
            pass                            # torn or damaged: run them again
    if todo and not (d / loop.best.lib.name).exists():    # said, not passed over: nothing left to run them on
        loop.view.message(f"iteration {rec.iteration}'s {', '.join(todo)} after its keep never answered, and the "
                          f"library it was kept with ({d.name}/{loop.best.lib.name}) is gone: the keep stands "
                          "without them")
        return None
    unanswered = rec.model_copy(update={"parity": rec.parity.model_copy(update={"later": todo})})
    return Pending.start(loop, unanswered, d, None, None)

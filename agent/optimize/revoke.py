"""A kept iteration revoked: a check run after its keep (tools/judge/later.py) refused its kernel (issue 66, slice
18). The steps, their order and why: agent/records/revoked.py; the records' side (the rewritten record, the state
before the keep) is there too.
"""

from __future__ import annotations

from pathlib import Path

from agent.optimize.gitops import revoked_message
from agent.records.revoked import restored, revoked_record
from agent.records.schema import Decision, IterationRecord, RunState
from agent.records.store import rewrite_iteration, write_json_atomic
from tools.results import SanitizerResult


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

"""A keep revoked by a check run after it (agent/records/revoked.py, issue 66 slice 18): on a real run's repository
and log (tests/test_review.py's, made once by `agent optimize` on the CPU task), the kept best is revoked as the
loop will when racecheck, run while the model proposes, refuses it. Then every reader takes it as a rejected
iteration (one record an iteration; show, report, cherry-pick), the state and the branch are back at the best before
it, the revoked commit is reviewable under its ref and no longer looks kept, and a kill in the middle of the
revocation is mended by `agent resume`'s recovery and the review's view from the branch."""

from __future__ import annotations

import shutil

import git
import pytest

from agent.optimize.gitops import RunGit
from agent.records.recover import is_kept_commit, recover
from agent.optimize.revoke import revoke
from agent.records.revoked import BEFORE, save_before, state_before
from agent.records.schema import Decision, Outcome
from agent.records.store import read_state, write_json_atomic
from agent.review.cherrypick import CherryPickError, cherry_pick
from agent.review.runs import load_run
from tests.test_review import RUN_ID, _make_run_repo, cli, user_checkout  # noqa: F401  (cli: the fixture)
from tests.userrepo import shared_by_workers
from tools.results import ParityStatus, SanitizerResult

RACE = SanitizerResult(tool="racecheck", status="failed", errors=1, shapes=2, seconds=4.9,
                       message="compute-sanitizer racecheck: 1 shared-memory race (at B=2,H=4,S=333): a "
                               "write-after-read hazard in block (3,0,0)")


@pytest.fixture
def run_repo(tmp_path_factory):
    made = shared_by_workers(tmp_path_factory, "review", _make_run_repo)
    mine = tmp_path_factory.mktemp("revoke")
    shutil.copytree(made.parent, mine, dirs_exist_ok=True, symlinks=True)
    repo = mine / "repo"      # the copied run worktree names the original's git folder: gone, made again below
    shutil.rmtree(repo / ".git" / "worktrees", ignore_errors=True)
    shutil.rmtree(repo / "runs" / RUN_ID / "worktree", ignore_errors=True)
    return repo


def test_a_revoked_keep_reads_as_rejected_everywhere_and_a_kill_mid_revocation_is_mended(run_repo, cli, tmp_path):
    run_dir = run_repo / "runs" / RUN_ID
    run = load_run(run_dir)
    rec = next(r for r in run.records if r.iteration == run.state.best_iteration)
    assert rec.decision == Decision.kept, [r.reason for r in run.records]
    before = state_before(run_dir, rec, run.records, run.state)      # none saved by this run: from the records
    assert before.best_sha == rec.parent_sha
    save_before(run_dir, rec.iteration, before)                       # as the loop does before a keep
    assert read_state(run_dir).best_sha == rec.commit_sha
    rgit = RunGit.attach(git.Repo(run_repo), tmp_path / "wt", run.cfg.branch, RUN_ID)
    rgit.reset_to(rec.commit_sha)
    new, state = revoke(run_dir, rgit, rec, run.state, before, [RACE])
    with pytest.raises(ValueError, match="only the last keep"):      # the best is no longer that keep
        revoke(run_dir, rgit, rec, state, before, [RACE])

    again = load_run(run_dir)
    assert [r.iteration for r in again.records] == [r.iteration for r in run.records]   # one record an iteration
    r = again.find(rec.iteration)
    assert (r.decision, r.outcome, r.kept_reason) == (Decision.revoked, Outcome.refused_after_keep, rec.reason)
    assert r.reason.startswith("revoked after the keep: compute-sanitizer racecheck: 1 shared-memory race")
    assert r.parity.status == ParityStatus.race and r.parity.racecheck.status == "failed"
    assert rec.iteration not in [k.iteration for k in again.kept()]
    assert again.state.best_sha == rec.parent_sha == rgit.head() and again.state.best_iteration == before.best_iteration
    assert again.state.iterations_done == run.state.iterations_done and again.state.usage == run.state.usage
    # the revoked commit: reviewable under its ref, the kept one's tree, a title no keep has
    copy = rgit.repo.commit(r.rejected_ref)
    assert r.rejected_ref == f"refs/agent/{RUN_ID}/revoked/{rec.iteration}" and copy.hexsha == r.commit_sha
    assert copy.tree.hexsha == rgit.repo.commit(rec.commit_sha).tree.hexsha
    assert copy.message.startswith("agent (revoked): ") and "Revoked: revoked after the keep" in copy.message
    assert is_kept_commit(run.cfg, copy) is None and is_kept_commit(run.cfg, rgit.repo.commit(rec.commit_sha)) == \
        rec.iteration
    # the readers
    rc, out, _ = cli("show", RUN_ID, cwd=run_repo)
    assert rc == 0 and "revoked" in out
    rc, out, err = cli("report", RUN_ID, cwd=run_repo)
    md = (run_dir / "report.md").read_text()
    assert rc == 0 and f"| {rec.iteration} | refused_after_keep |" in md, out + err      # a rejected hypothesis
    wt = user_checkout(run_repo, tmp_path, "user-revoked")
    with pytest.raises(CherryPickError, match=f"iteration {rec.iteration} .* was not kept"):
        cherry_pick(again, wt, iteration=rec.iteration)

    # a kill after the record and before the state: the state still names the revoked keep; resume mends it
    write_json_atomic(run_dir / "state.json", run.state)
    got = recover(run_dir, run.cfg, run.state, rgit)
    assert got is not None and got[0].best_sha == rec.parent_sha and "was revoked" in got[1], got
    assert read_state(run_dir).best_sha == rec.parent_sha
    # without the saved state, it is rebuilt from the records
    (run_dir / f"iter-{rec.iteration}" / BEFORE).unlink()
    write_json_atomic(run_dir / "state.json", run.state)
    assert recover(run_dir, run.cfg, run.state, rgit)[0].best_sha == rec.parent_sha
    # a kill after the state and before the branch went back, the state then lost: the view from the branch does
    # not follow the revoked keep at its tip
    rgit.reset_to(rec.commit_sha)
    (run_dir / "state.json").write_text("{damaged")
    seen = load_run(run_dir)
    assert seen.state.best_sha != rec.commit_sha and rec.iteration not in [k.iteration for k in seen.kept()]

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
from agent.optimize.revoke import REFUSED, Refusal, revoke
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


def test_the_checks_after_a_keep_settle_it_clean_or_revoke_it_with_the_best_it_found(run_repo, tmp_path, monkeypatch):
    """The loop's side (agent/optimize/revoke.py Pending), on the review's real run: the kept best's confirmation left
    racecheck for later (as a GPU confirmation answers unless AGENT_RACECHECK_LATER=0); the real judge child runs it
    under a stand-in sanitizer. Clean: the kept record is rewritten with its result, nothing else moves. A race,
    settled as the next proposal is about to be applied (settled_parent): the keep is revoked, the loop's own state
    object, the best's library, launch and profile are what the keep found, and the proposal's parent is that best."""
    from types import SimpleNamespace

    from agent.evaluation.spares import Spares
    from agent.optimize.revoke import LIB_BEFORE, Pending, settle, settled_parent
    from agent.records.schema import StageTimes
    from tests.test_later import _wrapper
    from tools.judge.sanitize import ERROR_EXIT
    from tools.task import load_task
    run_dir = run_repo / "runs" / RUN_ID
    run = load_run(run_dir)
    i = run.state.best_iteration
    d = run_dir / f"iter-{i}"
    rgit = RunGit.attach(git.Repo(run_repo), tmp_path / "wt", run.cfg.branch, RUN_ID)
    lib_name = next(p.name for p in d.glob("lib*.so"))
    best_lib = tmp_path / "best" / lib_name
    best_lib.parent.mkdir()
    best_lib.write_bytes(b"the best before the keep")
    messages = []
    loop = SimpleNamespace(run_dir=run_dir, git=rgit, records=list(run.records), state=run.state.model_copy(),
                           best=SimpleNamespace(lib=best_lib, launch="launch before", profile="profile before"),
                           view=SimpleNamespace(message=messages.append), reload_task=lambda: None,
                           task=load_task(run_repo / run.cfg.task_dir),
                           evaluator=SimpleNamespace(scratch_root=tmp_path / "scratch", later=("racecheck",),
                                                     spare=Spares()))     # a CPU task's: nothing held
    before = state_before(run_dir, run.find(i), run.records, run.state)
    loop.state = before.model_copy(update={"iterations_done": run.state.iterations_done})
    rec = run.find(i)
    rec = rec.model_copy(update={"parity": rec.parity.model_copy(update={"later": ["racecheck"]})})
    was = Pending.before(loop, i, d, SimpleNamespace(parity=rec.parity))       # as the keep begins: what it finds
    assert was == ("launch before", "profile before") and (d / LIB_BEFORE).read_bytes() == b"the best before the keep"
    # the parity that names the check left for later is on disk before the keep: a kill before the record is written
    # leaves what rebuilds the record from the commit (agent/records/recover.py) naming it, for `agent resume`
    assert '"later":["racecheck"]' in (d / "parity.json").read_text().replace(" ", "").replace("\n", "")
    loop.state = run.state.model_copy()               # the keep made (the loop's own state object from here)
    state_obj = loop.state
    shutil.copy2(d / lib_name, best_lib)
    loop.best.launch, loop.best.profile = "launch of the keep", "profile of the keep"
    loop.records = [rec if r.iteration == i else r for r in loop.records]

    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path)))
    loop._pending = Pending.start(loop, rec, d, *was)
    assert settle(loop) is None and loop._pending is None
    clean = load_run(run_dir).find(i)
    assert clean.decision == Decision.kept and clean.parity.racecheck.status == "ok", clean.parity
    assert "racecheck clean on" in clean.parity.message and loop.state.best_sha == rec.commit_sha

    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path, exit_code=ERROR_EXIT)))
    loop._pending = Pending.start(loop, clean, d, *was)
    a = SimpleNamespace(parent_sha=rec.commit_sha, times=StageTimes())     # the next proposal, made on the keep
    settled_parent(loop, a)
    gone = load_run(run_dir).find(i)
    assert gone.decision == Decision.revoked and loop._pending is None and a.parent_sha == rec.parent_sha
    assert a.times.later > 0 and "the proposal goes onto" in messages[-1]
    kept = Refusal.model_validate_json((d / REFUSED).read_text()).sanitizers      # the refusal, kept before it
    assert [(s.tool, s.status) for s in kept] == [("racecheck", "failed")]
    settled_parent(loop, a)            # nothing pending: nothing waited for
    assert a.parent_sha == rec.parent_sha
    assert loop.state is state_obj and loop.state.best_sha == rec.parent_sha == rgit.head()
    assert best_lib.read_bytes() == b"the best before the keep"
    assert (loop.best.launch, loop.best.profile) == ("launch before", "profile before")
    assert [r.decision for r in loop.records if r.iteration == i] == [Decision.revoked]
    assert read_state(run_dir).best_sha == rec.parent_sha and "revoked" in messages[-2]


@pytest.mark.parametrize("saved", [False, True])
def test_resume_runs_the_checks_a_kill_left_unanswered_and_revokes_the_keep_they_refuse(run_repo, cli, tmp_path,
                                                                                        monkeypatch, saved):
    """A run killed while the checks after its last keep ran: its kept record names them in parity.later with no
    result. `agent resume` runs them before it goes on (agent/optimize/revoke.py unchecked_best); refused, the keep is
    revoked and the run goes on from the best before it. Through the real entry point, under a stand-in sanitizer
    that reports a race. `saved`: they had answered, refusing it, and the run stopped before the revocation ended (a
    git lock, a kill): the refusal kept in its folder (REFUSED) revokes it, not a second run of the check (the
    stand-in sanitizer here would pass it)."""
    from agent.records.store import read_config, read_iterations, rewrite_iteration
    from tests.test_later import _wrapper
    from tools.judge.sanitize import ERROR_EXIT
    run_dir = run_repo / "runs" / RUN_ID
    cfg = read_config(run_dir)        # the run moved with its repository (this copy): where it is now
    write_json_atomic(run_dir / "run.json", cfg.model_copy(update={"repo": str(run_repo),
                                                                   "worktree": str(tmp_path / "wt")}))
    state = read_state(run_dir)
    write_json_atomic(run_dir / "state.json", state.model_copy(update={"status": "interrupted"}))
    rec = next(r for r in read_iterations(run_dir) if r.iteration == state.best_iteration)
    later = rec.parity.model_copy(update={"later": ["racecheck"]})     # as the kill left it: no racecheck result
    rewrite_iteration(run_dir, rec.model_copy(update={"parity": later}))
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path, exit_code=0 if saved else ERROR_EXIT)))
    if saved:
        write_json_atomic(run_dir / f"iter-{rec.iteration}" / REFUSED, Refusal(sanitizers=[RACE]))
    rc, out, err = cli("resume", RUN_ID, cwd=run_repo)
    assert rc == 0, out + err
    said = "revoking it now" if saved else "had not answered when the run was stopped"
    assert said in out + err and "keep revoked" in out + err, out + err
    run = load_run(run_dir)
    got = run.find(rec.iteration)
    assert got.decision == Decision.revoked and got.parity.racecheck.status == "failed", got.reason
    assert (got.parity.racecheck == RACE) == saved
    assert run.state.best_sha == rec.parent_sha and run.state.status == "done"
    assert git.Repo(run_repo).commit(cfg.branch).hexsha == rec.parent_sha


def test_resume_says_so_where_the_library_a_keep_was_kept_with_is_gone(run_repo, tmp_path):
    """unchecked_best with nothing to run the unanswered check on (the iteration's library deleted): it is said, and
    the keep stands without it; with the library there, the check is started."""
    from types import SimpleNamespace

    from agent.evaluation.spares import Spares
    from agent.optimize.revoke import unchecked_best
    from tools.task import load_task
    run_dir = run_repo / "runs" / RUN_ID
    run = load_run(run_dir)
    rec = run.find(run.state.best_iteration)
    rec = rec.model_copy(update={"parity": rec.parity.model_copy(update={"later": ["racecheck"]})})
    lib = next((run_dir / f"iter-{rec.iteration}").glob("lib*.so"))
    messages = []
    loop = SimpleNamespace(run_dir=run_dir, records=[rec], state=run.state,
                           best=SimpleNamespace(lib=tmp_path / lib.name), view=SimpleNamespace(message=messages.append),
                           task=load_task(run_repo / run.cfg.task_dir),
                           evaluator=SimpleNamespace(scratch_root=tmp_path / "scratch", spare=Spares()))
    pending = unchecked_best(loop)
    assert pending is not None and pending.later.checks == ("racecheck",) and not messages
    pending.close()
    lib.unlink()
    assert unchecked_best(loop) is None and "is gone: the keep stands without them" in messages[-1], messages


def test_the_run_settles_the_last_keeps_checks_before_it_may_stop_and_ends_them_on_an_error():
    """agent/optimize/revoke.py stop_reason and settle, the loop's two exits: where the run may stop (its iterations
    spent, here) the last keep's checks are settled before the stop is decided (a best they revoke must not be the
    one the run stops on, nor be benched beside them); an error (or a Ctrl-C) while they are waited for ends them."""
    from types import SimpleNamespace

    from agent.optimize.revoke import settle, stop_reason

    class Checks:      # the Pending's side the loop sees: settle waits, close ends
        def __init__(self, fail: bool = False):
            self.fail, self.settled, self.closed = fail, False, False

        def settle(self, loop):
            if self.fail:
                raise KeyboardInterrupt
            self.settled = True
            return None

        def close(self):
            self.closed = True

    seen = []
    loop = SimpleNamespace(cfg=SimpleNamespace(past_target=False, iters=3), state=SimpleNamespace(iterations_done=1),
                           run_end=float("inf"), _pending=Checks(),
                           best=SimpleNamespace(target_reached=lambda: False,
                                                stop_reason=lambda end: seen.append(loop._pending) or None))
    assert stop_reason(loop) is None and not loop._pending.settled      # the run goes on: they keep running
    loop.state.iterations_done = 3
    checks = loop._pending
    stop_reason(loop)
    assert checks.settled and seen[-1] is None and loop._pending is None
    loop._pending = failing = Checks(fail=True)
    with pytest.raises(KeyboardInterrupt):
        settle(loop)
    assert failing.closed and loop._pending is None

"""The revert after a Ctrl-C and the lock the agent's own interrupted git child held.

A terminal's Ctrl-C goes to the whole foreground group: the agent and whichever git command it was running. The
revert after it found the worktree's index.lock or HEAD.lock and failed (test_kill_safety's SIGINT case, once in about
17 runs; the lock was still there 10 s on). While a git child of the agent is running, the lock is its and is waited
for; once none is, the lock is stale and the run's own locks are cleared, as `agent resume` clears them. Real git,
real locks, a real git child."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import git
import pytest

from agent.optimize.gitops import RunGit, _after_locks
from tests.userrepo import make_user_repo


def _run_git(tmp_path: Path) -> tuple[RunGit, str, Path, Path]:
    root = make_user_repo(tmp_path / "user")
    repo = git.Repo(root)
    base = repo.head.commit.hexsha
    rg = RunGit.create(repo, tmp_path / "wt", "agent/t/locks", "locks", base)
    (tmp_path / "wt" / "extra.txt").write_text("a candidate's file\n")
    rg.commit(["extra.txt"], "candidate")
    lock = Path(rg.wt.git.rev_parse("--absolute-git-dir")) / "index.lock"
    return rg, base, lock, root


def test_a_lock_a_running_git_child_holds_is_waited_for_not_removed(tmp_path):
    rg, base, lock, _ = _run_git(tmp_path)
    lock.write_text("")
    # a git child of this process, still running (as the interrupted one may be, exiting): it reads stdin until closed
    child = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=tmp_path / "wt", stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL)
    held = {}

    def let_go() -> None:
        held["still there"] = lock.exists()    # not taken from under the running git
        lock.unlink(missing_ok=True)
        child.stdin.close()
        child.wait()

    timer = threading.Timer(0.5, let_go)
    timer.start()
    try:
        rg.reset_to(base)
    finally:
        timer.join()
    assert held == {"still there": True}
    assert rg.head() == base and not (tmp_path / "wt" / "extra.txt").exists()


def test_a_lock_no_running_git_holds_is_the_runs_stale_lock_and_is_cleared(tmp_path):
    rg, base, lock, root = _run_git(tmp_path)
    lock.write_text("")
    users = root / ".git" / "index.lock"       # the user's own: their git may be running; never the agent's to take
    users.write_text("")
    rg.reset_to(base)
    assert rg.head() == base and not lock.exists() and users.exists()
    lock.write_text("")
    # without the run's clearing (the caller holds no run): the error stands, at once
    with pytest.raises(git.GitCommandError, match="index.lock"):
        _after_locks(rg.wt.git.reset, "-q", "--hard", base, wait_s=30)
    # and a git error that is not a lock is not retried
    lock.unlink()
    with pytest.raises(git.GitCommandError):
        _after_locks(rg.wt.git.reset, "-q", "--hard", "no-such-commit", clear=rg.clear_stale_locks, wait_s=30)

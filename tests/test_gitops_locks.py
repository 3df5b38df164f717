"""The revert after a Ctrl-C waits for the lock the agent's own dying git child still holds.

A terminal's Ctrl-C goes to the whole foreground group: the agent and whichever git command it was running. git removes
its lock files on SIGINT, but a moment after the agent's handler has started the revert, whose `git reset` then found
the worktree's HEAD.lock and failed (once in about 17 runs of test_kill_safety's SIGINT case). Real git, real locks."""

from __future__ import annotations

import threading
from pathlib import Path

import git
import pytest

from agent.gitops import RunGit, _after_locks
from tests.userrepo import make_user_repo


def _run_git(tmp_path: Path) -> tuple[RunGit, str, Path]:
    root = make_user_repo(tmp_path / "user")
    repo = git.Repo(root)
    base = repo.head.commit.hexsha
    rg = RunGit.create(repo, tmp_path / "wt", "agent/t/locks", "locks", base)
    (tmp_path / "wt" / "extra.txt").write_text("a candidate's file\n")
    rg.commit(["extra.txt"], "candidate")
    lock = Path(rg.wt.git.rev_parse("--absolute-git-dir")) / "HEAD.lock"
    return rg, base, lock


def test_a_revert_waits_for_a_lock_that_is_let_go(tmp_path):
    rg, base, lock = _run_git(tmp_path)
    lock.write_text("")
    timer = threading.Timer(0.4, lock.unlink)   # the dying child lets go of it
    timer.start()
    try:
        rg.reset_to(base)
    finally:
        timer.join()
    assert rg.head() == base and not (tmp_path / "wt" / "extra.txt").exists()


def test_a_lock_that_stays_is_an_error_not_a_wait_forever(tmp_path):
    rg, base, lock = _run_git(tmp_path)
    lock.write_text("")   # a stale lock (a SIGKILLed git's): `agent resume` clears it; the revert does not guess
    with pytest.raises(git.GitCommandError, match="HEAD.lock"):
        _after_locks(rg.wt.git.reset, "-q", "--hard", base, wait_s=0.3)
    assert rg.head() != base
    # and a git error that is not a lock is not retried
    with pytest.raises(git.GitCommandError):
        _after_locks(rg.wt.git.reset, "-q", "--hard", "no-such-commit", wait_s=30)

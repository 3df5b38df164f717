"""Git for a run: its own worktree and branch, commits with trailers, rejected commits under refs.

The user's checkout, index, branches and uncommitted work are never touched: everything happens in
runs/RUN/worktree on branch agent/TASK/RUN, created from the user's HEAD. The only write outside
the worktree is `/runs/` added to .git/info/exclude (a local, untracked file) when runs/ is not
already ignored, so that the run folder never shows up in the user's `git status`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import git

if TYPE_CHECKING:
    from agent.evaluation.attempt import Attempt
    from agent.records.figures import Figure

AGENT_IDENTITY = {
    "GIT_AUTHOR_NAME": "kernel-agent", "GIT_AUTHOR_EMAIL": "kernel-agent@localhost",
    "GIT_COMMITTER_NAME": "kernel-agent", "GIT_COMMITTER_EMAIL": "kernel-agent@localhost",
}


class GitError(Exception):
    pass


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise GitError(f"{path} is not inside a git repository: the agent works on a branch of yours. "
                       "Run `git init && git add -A && git commit -m init` first.") from None


def ensure_runs_ignored(repo: git.Repo, runs_dir: Path) -> bool:
    """Make runs/ invisible to `git status` without touching tracked files. Returns True if it added a line."""
    root = Path(repo.working_tree_dir)
    try:
        rel = runs_dir.resolve().relative_to(root.resolve())
    except ValueError:
        return False   # runs dir outside the repository
    probe = f"{rel.as_posix()}/probe"
    try:
        repo.git.check_ignore("-q", probe)
        return False
    except git.GitCommandError:
        pass
    exclude = Path(repo.git_dir) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a") as f:
        f.write(f"\n# kernel-agent run folders\n/{rel.as_posix()}/\n")
    return True


def _lock_busy(e: BaseException) -> bool:
    """git refused because another git holds a lock file ("Unable to create '.../HEAD.lock': File exists")."""
    return isinstance(e, git.GitCommandError) and ".lock" in str(e.stderr) and "File exists" in str(e.stderr)


def _git_child_running() -> bool:
    """A git command among this process's children that is still running (not a zombie): one a Ctrl-C interrupted may
    still be exiting. GitPython's long-lived `git cat-file --batch` readers take no lock and do not count."""
    kids: list[str] = []
    for t in Path("/proc/self/task").glob("*/children"):
        try:
            kids += t.read_text().split()
        except OSError:
            continue
    for pid in kids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and Path(cmd[0].decode(errors="replace")).name == "git" and b"cat-file" not in cmd:
            return True
    return False


def _after_locks(call, *args, clear=None, wait_s: float = 10.0):
    """Run a git command that may follow a Ctrl-C. A terminal's SIGINT reaches the agent's own git child too, and the
    revert after it can start while that child still holds the worktree's index.lock or HEAD.lock: waited for while a
    git child of this process is running, up to wait_s. A lock no running git of this process holds is stale (the
    interrupted git's, left behind: test_kill_safety's SIGINT case found index.lock still there 10 s on, once in some
    17 runs); the run's lock (runlog.hold_run) keeps every other agent out of its worktree, so `clear` (the run's
    clear_stale_locks, what `agent resume` does) removes it and the command runs again, once."""
    import time
    deadline, cleared = time.monotonic() + wait_s, False
    while True:
        try:
            return call(*args)
        except git.GitCommandError as e:
            if not _lock_busy(e):
                raise
            running = _git_child_running()
            if running and time.monotonic() < deadline:
                time.sleep(0.05)
            elif clear is not None and not cleared and not running:
                clear()
                cleared = True
            else:
                raise


class RunGit:
    """The run's branch and worktree."""

    def __init__(self, repo: git.Repo, worktree: Path, branch: str, run_id: str):
        self.repo, self.worktree, self.branch, self.run_id = repo, worktree, branch, run_id
        # the run's commits and refs synced to the disk as git writes them (git 2.36+; an older git ignores it), so
        # that state.json, synced after, never names a commit a power cut lost; set for this process's git commands
        # only, never in the user's config
        repo.git.update_environment(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="core.fsync",
                                    GIT_CONFIG_VALUE_0="committed,reference")

    # --- setup --------------------------------------------------------------------------------
    @classmethod
    def create(cls, repo: git.Repo, worktree: Path, branch: str, run_id: str, base_sha: str) -> "RunGit":
        if branch in [h.name for h in repo.heads]:
            raise GitError(f"branch {branch} already exists (a run with this id?); choose another --run-id")
        repo.git.worktree("add", "-b", branch, str(worktree), base_sha)
        return cls(repo, worktree, branch, run_id)

    @classmethod
    def attach(cls, repo: git.Repo, worktree: Path, branch: str, run_id: str) -> "RunGit":
        """For resume: re-use the worktree, or re-create it from the branch if it was removed."""
        if not (worktree / ".git").exists():
            repo.git.worktree("prune")
            if branch not in [h.name for h in repo.heads]:
                raise GitError(f"branch {branch} is gone: this run cannot be resumed")
            repo.git.worktree("add", str(worktree), branch)
        return cls(repo, worktree, branch, run_id)

    def clear_stale_locks(self) -> list[str]:
        """Remove the lock files a SIGKILL in the middle of a git command leaves (index.lock, a ref's .lock),
        which would fail every later git command in the run's worktree. Only the run's own: its worktree's
        index and HEAD, its branch and refs/agent/RUN/; never the user's index or packed-refs. The caller
        holds the run's lock (runlog.hold_run), so no agent process is using them."""
        wt_git = Path(self.wt.git.rev_parse("--absolute-git-dir"))
        common = Path(self.repo.git.rev_parse("--git-common-dir"))
        common = common if common.is_absolute() else Path(self.repo.working_tree_dir) / common
        found = [wt_git / "index.lock", wt_git / "HEAD.lock", common / "refs" / "heads" / f"{self.branch}.lock"]
        found += sorted((common / "refs" / "agent" / self.run_id).rglob("*.lock"))
        gone = []
        for f in found:
            if f.is_file():
                f.unlink()
                gone.append(str(f))
        return gone

    @property
    def wt(self) -> git.Repo:
        return git.Repo(self.worktree)

    def head(self) -> str:
        return self.wt.head.commit.hexsha

    # --- the candidate ------------------------------------------------------------------------
    def diff(self, paths: list[str]) -> str:
        """Unified diff of the worktree's uncommitted changes in `paths` (relative to the worktree)."""
        return self.wt.git.diff("HEAD", "--", *paths)

    def commit(self, paths: list[str], message: str) -> str:
        wt = self.wt
        wt.git.add("--", *paths)
        with _env(AGENT_IDENTITY):
            wt.git.commit("-q", "--no-verify", "-m", message)
        return wt.head.commit.hexsha

    def amend_message(self, message: str) -> str:
        with _env(AGENT_IDENTITY):
            _after_locks(self.wt.git.commit, "-q", "--amend", "--no-verify", "-m", message, clear=self.clear_stale_locks)
        return self.head()

    def keep_ref(self, kind: str, iteration: int | str, sha: str) -> str:
        ref = f"refs/agent/{self.run_id}/{kind}/{iteration}"
        _after_locks(self.repo.git.update_ref, ref, sha, clear=self.clear_stale_locks)
        return ref

    def copy_commit(self, sha: str, message: str) -> str:
        """A new commit of `sha`'s tree and parent with `message` (a kept commit revoked: agent/records/revoked.py);
        no branch moves."""
        c = self.repo.commit(sha)
        with _env(AGENT_IDENTITY):
            parents = [a for p in c.parents for a in ("-p", p.hexsha)]
            return _after_locks(self.repo.git.commit_tree, c.tree.hexsha, *parents, "-m", message,
                                clear=self.clear_stale_locks)

    def reset_to(self, sha: str) -> None:
        """Branch back to `sha` (the best); the worktree's files follow. Only the run's worktree moves."""
        wt = self.wt
        _after_locks(wt.git.reset, "-q", "--hard", sha, clear=self.clear_stale_locks)
        _after_locks(wt.git.clean, "-q", "-fd", clear=self.clear_stale_locks)



class _env:
    """Temporarily set environment variables (git identity for the agent's commits)."""

    def __init__(self, values: dict[str, str]):
        self.values, self.saved = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def commit_message(title: str, body: list[str], trailers: dict[str, str]) -> str:
    lines = [title.strip().splitlines()[0][:72], ""]
    lines += [b for b in body if b is not None]
    lines += [""] + [f"{k}: {v}" for k, v in trailers.items()]
    return "\n".join(lines).strip() + "\n"


# --- the messages of the run's commits --------------------------------------------------------
def _trailers(run_id: str, iteration: int) -> dict[str, str]:
    return {"Agent-Run": run_id, "Agent-Iteration": str(iteration)}


def candidate_message(run_id: str, iteration: int, hypothesis: str) -> str:
    """A candidate under evaluation; the keep or the reject amends it."""
    return commit_message(f"agent: iteration {iteration} (under evaluation)", [hypothesis], _trailers(run_id, iteration))


def rejected_message(run_id: str, iteration: int, summary: str, hypothesis: str, reason: str) -> str:
    return commit_message(f"agent (rejected): {summary}", [hypothesis, "", f"Rejected: {reason}"],
                          _trailers(run_id, iteration))


def revoked_message(run_id: str, iteration: int, kept: str, reason: str) -> str:
    """A kept commit's message once a check after the keep refused it: its title no kept commit's (nothing rebuilds
    a keep from it: agent/records/recover.py is_kept_commit), why, then the message it was kept with."""
    title = kept.splitlines()[0] if kept else ""
    return commit_message(f"agent (revoked): {title.removeprefix('agent: ')}",
                          [f"Revoked: {reason}", "", "Kept before with:", *("  " + ln for ln in kept.splitlines())],
                          _trailers(run_id, iteration))


def kept_message(run_id: str, a: "Attempt", vs_initial: "Figure | None") -> str:
    """A kept candidate: the measured figures in the body, the speedup also as a trailer (for `git log
    --format=%(trailers)` and the review commands). A commit message outlives the run and is what a
    reviewer cherry-picks, so it carries only figures of benches that timed this commit against what it
    is compared to (and the chain of such benches, named as such): the figure against the reference is the
    confirmation bench's, which timed the reference beside it, never the setup's multiplied in, taken minutes
    earlier (one printed 7.98x where torch was 11x faster). `agent show` gives the run's confirmed one."""
    from tools.task import shape_label
    p, bench, parity = a.proposal, a.bench, a.parity
    ci, cand = bench.speedup_vs_baseline, bench.timing("candidate")
    again = a.confirm.speedup_vs_baseline if a.confirm is not None else None
    ref = a.confirm.speedup_vs_reference_ci if a.confirm is not None else None
    max_err = max((c.max_abs_err or 0.0) for c in parity.checks) if parity.checks else 0.0
    body = [p.hypothesis, "",
            f"Measured on {shape_label(bench.shape)}: {cand.median_ms * 1e3:.2f} us median "
            f"(p10 {cand.p10_ms * 1e3:.2f}, p90 {cand.p90_ms * 1e3:.2f}); "
            f"{ci.median:.3f}x over the parent ({ci.confidence:.0%} CI {ci.low:.3f}-{ci.high:.3f}, {ci.rounds} ABAB rounds)"
            + (f"; confirmed by a second bench at {again.median:.3f}x ({again.confidence:.0%} CI {again.low:.3f}-"
               f"{again.high:.3f}, {again.rounds} rounds: sized to the first's noise)" if again else "")
            + (f"; that bench timed the PyTorch reference beside it: {ref.median:.3f}x ({ref.confidence:.0%} CI "
               f"{ref.low:.3f}-{ref.high:.3f}) against it." if ref else "."),
            f"Cumulative: {_fig(vs_initial)} vs the initial kernel "
            f"({vs_initial.source if vs_initial else 'not measured'}).",
            f"Parity: {len(parity.checks)} checks, max abs error {max_err:.3g}.",
            f"Predicted: {p.predicted.metric} {p.predicted.direction}, {p.predicted.speedup:g}x."]
    # a sanitizer the user let the keep go without (AGENT_ALLOW_UNCHECKED, tools/judge/judge.py `unchecked`): named
    gone = [m.tool for m in (parity.memcheck, parity.racecheck) if m is not None and m.status in ("skipped", "error")]
    return commit_message(f"agent: {p.summary()}", body,
                          {**_trailers(run_id, a.iteration), "Speedup": f"{ci.median:.3f}x ({ci.confidence:.0%} CI {ci.low:.3f}-{ci.high:.3f})",
                           **({"Unchecked": f"{', '.join(gone)} (did not run; kept as AGENT_ALLOW_UNCHECKED allows)"}
                              if gone else {})})


def _fig(f: "Figure | None") -> str:
    return f.text() if f is not None else "n/a"



"""`agent cherry-pick RUN [--iter N | --best] [--onto BRANCH] [--squash]`: the run's kept commits onto a
branch of the user's, all or nothing.

The picks happen in a temporary worktree, detached at the target branch's head; only when every
commit applied is the branch moved: the current branch by a fast-forward of the user's checkout
(which must have no changes to tracked files), another branch by a compare-and-swap of its ref. The
user's checkout is never switched, and a conflict leaves the branch, the index and the files as they
were, with the commit and the files that conflicted named.

Only the run's own commits are taken (the Agent-Run and Agent-Iteration trailers must say so), and
only iterations that were kept.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from agent.review.runs import Run
from agent.records.schema import Decision, IterationRecord


class CherryPickError(Exception):
    """Refused or failed; nothing was changed."""


@dataclass
class Picked:
    iteration: int
    sha: str
    new_sha: str | None = None
    note: str = ""


@dataclass
class CherryPickResult:
    branch: str
    old_sha: str
    new_sha: str
    picked: list[Picked] = field(default_factory=list)
    squashed: bool = False
    message: str = ""


def _git(cwd: Path, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise CherryPickError(f"git {' '.join(args[:2])} failed: {_last(p.stderr or p.stdout)}")
    return p


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("hint:")]
    return " ".join(lines[-3:]) if lines else "(no message)"


# --- what to pick -----------------------------------------------------------------------------
def choose(run: Run, iteration: int | None) -> list[IterationRecord]:
    """--iter N: that kept iteration. Default (--best): every kept commit up to the best."""
    if iteration is not None:
        rec = run.record(iteration)
        if rec.decision != Decision.kept:
            where = f"; its commit is kept under {rec.rejected_ref}" if rec.rejected_ref else ""
            raise CherryPickError(f"iteration {iteration} of run {run.id} was not kept ({rec.decision.value}: "
                                  f"{rec.reason}){where}. Only kept iterations are cherry-picked.")
        return [rec]
    best = run.state.best_iteration
    if best is None:
        raise CherryPickError(f"run {run.id} kept no iteration: the initial kernel is still the best; nothing to pick")
    if run.find(best) is None:   # lost, and not rebuilt from its commit (agent/review/runs.py says why)
        raise CherryPickError(f"run {run.id}: the best (iteration {best}) has no record and its commit could not be "
                              "read; nothing was picked (`agent resume RUN --repair` rebuilds the record where the "
                              "commit is there)")
    recs = [r for r in run.kept() if r.iteration <= best]
    if not recs:
        raise CherryPickError(f"run {run.id}: the log records no kept iteration up to the best ({best})")
    return recs


_TRAILER = re.compile(r"^([A-Za-z-]+):\s*(.*?)\s*$")


def trailers(message: str) -> dict[str, list[str]]:
    last = message.strip().split("\n\n")[-1]
    out: dict[str, list[str]] = {}
    for line in last.splitlines():
        m = _TRAILER.match(line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def verify_own(root: Path, run: Run, rec: IterationRecord) -> str:
    sha = rec.commit_sha
    if not sha:
        raise CherryPickError(f"iteration {rec.iteration} of run {run.id} has no commit in the log")
    if _git(root, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode != 0:
        raise CherryPickError(f"commit {sha[:10]} (iteration {rec.iteration}) is not in this repository "
                              f"(was branch {run.cfg.branch} deleted, or is this another clone?)")
    tr = trailers(_git(root, "show", "-s", "--format=%B", sha).stdout)
    if run.id not in tr.get("Agent-Run", []) or str(rec.iteration) not in tr.get("Agent-Iteration", []):
        raise CherryPickError(f"commit {sha[:10]} is not run {run.id}'s iteration {rec.iteration} (its trailers say "
                              f"Agent-Run {tr.get('Agent-Run', ['-'])[0]}, Agent-Iteration "
                              f"{tr.get('Agent-Iteration', ['-'])[0]}); refusing to pick a commit the agent did "
                              "not make in this run")
    return sha


# --- where to put them ------------------------------------------------------------------------
def current_branch(root: Path) -> str | None:
    p = _git(root, "symbolic-ref", "--short", "-q", "HEAD", check=False)
    return p.stdout.strip() or None


def _checked_out_elsewhere(root: Path, branch: str) -> str | None:
    path = None
    for line in _git(root, "worktree", "list", "--porcelain").stdout.splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree "):]
        elif line == f"branch refs/heads/{branch}":
            return path
    return None


def _check_clean(root: Path, git_dir: Path) -> None:
    for marker, what in (("CHERRY_PICK_HEAD", "a cherry-pick"), ("MERGE_HEAD", "a merge"),
                         ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or am"),
                         ("REVERT_HEAD", "a revert")):
        if (git_dir / marker).exists():
            raise CherryPickError(f"{what} is in progress in {root}; finish or abort it first")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    if dirty:
        files = ", ".join(ln[3:] for ln in dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise CherryPickError(f"your working tree has uncommitted changes to tracked files ({files}); commit or "
                              "stash them first. Nothing was changed.")


# --- doing it ---------------------------------------------------------------------------------
def cherry_pick(run: Run, cwd: Path, iteration: int | None = None, onto: str | None = None,
                squash: bool = False) -> CherryPickResult:
    top = _git(cwd, "rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0:
        raise CherryPickError(f"{cwd} is not inside a git repository")
    root = Path(top.stdout.strip())
    git_dir = Path(_git(root, "rev-parse", "--absolute-git-dir").stdout.strip())
    current = current_branch(root)
    target = onto or current
    if target is None:
        raise CherryPickError("you are on a detached HEAD: check out a branch, or name one with --onto BRANCH")
    if _git(root, "rev-parse", "--verify", "-q", f"refs/heads/{target}", check=False).returncode != 0:
        raise CherryPickError(f"no branch {target!r} (create it first: git branch {target})")
    in_place = target == current
    if in_place:
        _check_clean(root, git_dir)
    else:
        elsewhere = _checked_out_elsewhere(root, target)
        if elsewhere:
            raise CherryPickError(f"branch {target} is checked out in {elsewhere}; run the cherry-pick there "
                                  "(or without --onto from that checkout)")
    recs = choose(run, iteration)
    picks = [Picked(r.iteration, verify_own(root, run, r)) for r in recs]
    old = _git(root, "rev-parse", f"refs/heads/{target}").stdout.strip()
    missing = _not_yet_applied(root, old, picks[-1].sha)
    todo = []
    for p in picks:
        if p.sha in missing:
            todo.append(p)
        else:
            p.note = f"already on {target}"
    if not todo:
        return CherryPickResult(target, old, old, picks, squash,
                                f"nothing to do: {', '.join(_it(p) for p in picks)} already on {target}")
    new = _apply_in_temp_worktree(root, run, recs, todo, target, old, squash)
    if new == old:
        return CherryPickResult(target, old, old, picks, squash,
                                f"nothing to do: the changes of {', '.join(_it(p) for p in todo)} are already on "
                                f"{target}")
    if in_place:
        if _git(root, "rev-parse", "HEAD").stdout.strip() != old:
            raise CherryPickError(f"{target} moved while picking; nothing was changed, try again")
        ff = _git(root, "merge", "--ff-only", "-q", new, check=False)
        if ff.returncode != 0:
            raise CherryPickError(f"cannot update your checkout: {_last(ff.stderr or ff.stdout)}. "
                                  f"Nothing was changed; {target} is still at {old[:10]}.")
    else:
        _git(root, "update-ref", "-m", f"agent cherry-pick {run.id}", f"refs/heads/{target}", new, old)
    res = CherryPickResult(target, old, new, picks, squash)
    what = ", ".join(f"{_it(p)} ({p.sha[:10]}" + (f" -> {p.new_sha[:10]})" if p.new_sha else ")") for p in todo)
    skipped = [p for p in picks if p.note]
    res.message = (f"{'squashed' if squash else 'picked'} {what} from run {run.id} onto {target}: "
                   f"{old[:10]} -> {new[:10]}" + "".join(f"; {_it(p)}: {p.note}" for p in skipped))
    return res


def _not_yet_applied(root: Path, target_sha: str, tip: str) -> set[str]:
    """Commits up to `tip` whose change is not on the target yet: neither an ancestor nor cherry-picked
    before (same patch id), so that picking a series twice is a no-op rather than a conflict."""
    out = _git(root, "rev-list", "--cherry-pick", "--right-only", "--no-merges", f"{target_sha}...{tip}").stdout
    return set(out.split())


def _it(p: Picked) -> str:
    return f"iteration {p.iteration}"


def _apply_in_temp_worktree(root: Path, run: Run, recs: list[IterationRecord], todo: list[Picked], target: str,
                            old: str, squash: bool) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="agent-cherry-pick-"))
    wt = tmp / "wt"
    _git(root, "worktree", "add", "-q", "--detach", str(wt), old)
    try:
        for p in todo:
            args = ["cherry-pick", "--no-commit" if squash else "-x", p.sha]
            r = _git(wt, *args, check=False)
            if r.returncode != 0:
                conflicted = _git(wt, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
                if not conflicted and "empty" in (r.stderr + r.stdout):
                    _git(wt, "cherry-pick", "--skip", check=False)
                    p.note = f"its change is already on {target}"
                    continue
                why = f"conflicts in {', '.join(conflicted)}" if conflicted else _last(r.stderr or r.stdout)
                raise CherryPickError(f"{_it(p)} ({p.sha[:10]}) does not apply on {target}: {why}. Nothing was "
                                      f"changed; {target} is still at {old[:10]}.")
            if not squash:
                p.new_sha = _git(wt, "rev-parse", "HEAD").stdout.strip()
        if squash:
            if _git(wt, "diff", "--cached", "--quiet", check=False).returncode == 0:
                raise CherryPickError(f"the picked changes are already on {target}; nothing to commit")
            _git(wt, "commit", "-q", "--no-verify", "-F", "-", input=squash_message(run, recs, todo))
        return _git(wt, "rev-parse", "HEAD").stdout.strip()
    finally:
        _git(root, "worktree", "remove", "--force", str(wt), check=False)
        _git(root, "worktree", "prune", check=False)
        try:
            tmp.rmdir()
        except OSError:
            pass


def squash_message(run: Run, recs: list[IterationRecord], todo: list[Picked]) -> str:
    by_it = {r.iteration: r for r in recs}
    its = [p.iteration for p in todo]
    cum, lines = 1.0, []
    for p in todo:
        r = by_it[p.iteration]
        ci = r.bench.speedup_vs_baseline if r.bench else None
        if ci:
            cum *= ci.median
        sp = f"{ci.median:.3f}x over its parent ({ci.confidence:.0%} CI {ci.low:.3f}-{ci.high:.3f})" if ci else "no timing"
        lines.append(f"- iteration {p.iteration} ({p.sha[:10]}): {r.proposal.summary() if r.proposal else '-'}; {sp}")
    title = f"agent: run {run.id}, iteration{'s' if len(its) > 1 else ''} {', '.join(map(str, its))}"
    body = [title[:72], "", f"Squashed from branch {run.cfg.branch}:", *lines, "",
            f"Agent-Run: {run.id}", *[f"Agent-Iteration: {i}" for i in its],
            f"Speedup: {cum:.3f}x (product of the kept ratios)"]
    return "\n".join(body) + "\n"

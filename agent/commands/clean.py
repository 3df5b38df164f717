"""`agent clean [RUN | --all] [--keep-branches] [--dry-run]`: frees what finished runs leave behind.

Removed: the run's worktree (through git), its build/ folder, the libraries copied into iter-*/ and
its refs under refs/agent/RUN/ (rejected and interrupted candidates). Kept: the logs (run.json,
state.json, iterations.jsonl, every iteration's JSON, log and diff), reports, best/ and initial/, so
`agent show` and `agent report` still work. The run's branch agent/TASK/RUN is deleted only when the
run kept nothing and its tip is still the commit the run started from; no other branch, nor the
user's checkout, index or working tree, is touched. A run still marked running is left alone: it may
be live, and `agent resume` needs its worktree.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import git
from rich.console import Console
from rich.markup import escape

from agent.commands.review import default_runs_dir
from agent.review.runs import Run, Unreadable, list_runs, load_run, resolve_run
from agent.records.store import LogError
from tools.console import make_console

FINISHED = ("done", "interrupted", "failed")


def err() -> Console:
    return make_console(stderr=True, highlight=False)


def out() -> Console:
    """Plain lines: paths and branch names are printed as they are, never read as markup."""
    return make_console(highlight=False, markup=False)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="remove the worktrees, build folders, libraries and rejected refs of "
                       "finished runs (the logs stay)")
    p.add_argument("run", nargs="?", help="run id (or a unique prefix, or the run folder)")
    p.add_argument("--all", action="store_true", help="every finished run under the runs folder")
    p.add_argument("--keep-branches", action="store_true",
                   help="keep the runs' branches agent/TASK/RUN even where the run kept nothing")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.add_argument("--runs-dir", type=Path, help="where runs are (default: REPO/runs)")
    p.set_defaults(func=cmd_clean)


@dataclass
class Step:
    """One thing to remove: what the output calls it, the bytes it frees, and how to remove it."""
    text: str
    size: int
    do: Callable[[], object]


@dataclass
class Plan:
    """What cleaning one run removes, and what it keeps on purpose (with the reason)."""
    run: Run
    removals: list[Step] = field(default_factory=list)
    branch: Step | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.removals)


class CleanError(Exception):
    pass


# --- the command ------------------------------------------------------------------------------
def cmd_clean(args) -> int:
    if bool(args.run) == bool(args.all):
        err().print("[red]error[/red]: name one run or pass --all (not both): agent clean RUN | --all", soft_wrap=True)
        return 2
    runs_dir = default_runs_dir(args)
    try:
        runs = [load_run(resolve_run(runs_dir, args.run))] if args.run else list_runs(runs_dir)
    except LogError as e:
        err().print(f"[red]error[/red]: {escape(str(e))}", soft_wrap=True)
        return 2
    if not runs:
        out().print(f"no runs under {runs_dir}")
        return 0
    freed, ok = 0, True
    for run in runs:
        n, good = clean_one(run, keep_branches=args.keep_branches, dry=args.dry_run)
        freed, ok = freed + n, ok and good
    verb = "would free" if args.dry_run else "freed"
    out().print(f"{verb} {human(freed)} in total", soft_wrap=True)
    return 0 if ok else 1


def clean_one(run: Run | Unreadable, *, keep_branches: bool, dry: bool) -> tuple[int, bool]:
    """Clean (or describe cleaning) one run and print its line. Returns the bytes freed and whether the run
    was cleaned or skipped on purpose (False: an error left it unclean)."""
    if isinstance(run, Unreadable):
        err().print(f"[yellow]skipped[/yellow] {escape(run.id)}: cannot read its log ({escape(run.reason)})",
                  soft_wrap=True)
        return 0, False
    if run.state.status not in FINISHED:
        out().print(f"run {run.id}: skipped: its status is {run.state.status!r}, not finished (it may be live, and "
                    f"`agent resume {run.id}` needs its worktree)", soft_wrap=True)
        return 0, True
    try:
        plan = make_plan(run, keep_branches)
    except (CleanError, git.GitCommandError, OSError) as e:
        err().print(f"[red]error[/red]: run {escape(run.id)}: {escape(one_line(e))}", soft_wrap=True)
        return 0, False
    if dry:
        out().print(describe(plan, plan.removals, plan.branch is not None, dry=True), soft_wrap=True)
        return plan.size, True
    return apply(plan)


def apply(plan: Plan) -> tuple[int, bool]:
    """Remove what the plan lists, in order; on an error, say what was removed before it."""
    done: list[Step] = []
    try:
        for step in plan.removals:
            step.do()
            done.append(step)
        if plan.branch is not None:
            plan.branch.do()
    except (git.GitCommandError, OSError) as e:
        if done:
            out().print(describe(plan, done, False, dry=False, with_notes=False), soft_wrap=True)
        err().print(f"[red]error[/red]: run {escape(plan.run.id)}: {escape(one_line(e))}", soft_wrap=True)
        return sum(s.size for s in done), False
    out().print(describe(plan, done, plan.branch is not None, dry=False), soft_wrap=True)
    return plan.size, True


def describe(plan: Plan, removed: list[Step], branch: bool, *, dry: bool, with_notes: bool = True) -> str:
    """The run's one line: what was (or would be) removed, the branch, and what was kept on purpose."""
    parts = []
    if removed:
        parts.append(("would remove " if dry else "removed ") + ", ".join(s.text for s in removed))
    if branch and plan.branch is not None:
        parts.append(("would delete " if dry else "deleted ") + plan.branch.text)
    if not parts:
        parts.append("nothing to remove")
    if with_notes:
        parts += plan.notes
    return f"run {plan.run.id}: " + "; ".join(parts)


# --- the plan ---------------------------------------------------------------------------------
def make_plan(run: Run, keep_branches: bool) -> Plan:
    repo = open_run_repo(run)
    trees = worktrees(repo)
    plan = Plan(run)
    plan_worktree(plan, repo, trees)
    build = run.dir / "build"
    if build.is_symlink():
        plan.removals.append(Step("build/ (a link)", 0, build.unlink))
    elif build.is_dir():
        size = tree_size(build)
        plan.removals.append(Step(f"build/ ({human(size)})", size, lambda: shutil.rmtree(build)))
    libs = sorted(p for p in run.dir.glob("iter-*/lib*.so") if p.is_file() and not p.is_symlink())
    if libs:
        size = sum(p.stat().st_size for p in libs)
        plan.removals.append(Step(f"{count(len(libs), 'library', 'libraries')} ({human(size)})", size,
                                  lambda: [p.unlink() for p in libs]))
    refs = run_refs(repo, run.id)
    if refs:
        plan.removals.append(Step(count(len(refs), "ref", "refs"), 0,
                                  lambda: [repo.git.update_ref("-d", r) for r in refs]))
    plan_branch(plan, repo, trees, keep_branches)
    return plan


def open_run_repo(run: Run) -> git.Repo:
    """The repository the run belongs to (run.json names it), opened exactly there: never a parent's."""
    try:
        return git.Repo(run.cfg.repo)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise CleanError(f"its repository {run.cfg.repo} is gone or no longer a git repository") from None


def worktrees(repo: git.Repo) -> list[tuple[Path, str | None]]:
    """The repository's worktrees as (path, checked-out branch or None), the main one first."""
    entries: list[tuple[Path, str | None]] = []
    for line in repo.git.worktree("list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            entries.append((Path(line[len("worktree "):]).resolve(), None))
        elif line.startswith("branch ") and entries:
            entries[-1] = (entries[-1][0], line[len("branch "):].removeprefix("refs/heads/"))
    return entries


def plan_worktree(plan: Plan, repo: git.Repo, trees: list[tuple[Path, str | None]]) -> None:
    """Remove the run's worktree through git (then prune), or only prune when its folder is already gone.
    The main worktree, or one with another branch checked out, is never removed."""
    cfg = plan.run.cfg
    path = Path(cfg.worktree).resolve()
    here = [(i, b) for i, (p, b) in enumerate(trees) if p == path]
    shown = display(path)
    if not here:
        if path.exists():
            plan.notes.append(f"left {shown}: it is not a worktree of {cfg.repo}")
        return
    index, branch = here[0]
    if index == 0 or path == Path(repo.working_tree_dir).resolve():
        plan.notes.append(f"left {shown}: it is the repository's main worktree")
    elif branch is not None and branch != cfg.branch:
        plan.notes.append(f"left {shown}: it has branch {branch} checked out, not the run's")
    elif not path.exists():
        plan.removals.append(Step(f"stale worktree entry {shown}", 0, lambda: repo.git.worktree("prune")))
    else:
        size = tree_size(path)

        def remove() -> None:
            repo.git.worktree("remove", "--force", str(path))
            repo.git.worktree("prune")
        plan.removals.append(Step(f"worktree {shown} ({human(size)})", size, remove))


def run_refs(repo: git.Repo, run_id: str) -> list[str]:
    """The run's refs under refs/agent/RUN/ (its rejected and interrupted candidates), and no others."""
    prefix = f"refs/agent/{run_id}/"
    listed = repo.git.for_each_ref("--format=%(refname)", prefix).splitlines()
    return [r for r in listed if r.startswith(prefix)]


def plan_branch(plan: Plan, repo: git.Repo, trees: list[tuple[Path, str | None]], keep_branches: bool) -> None:
    """Delete the run's branch only when nothing would be lost: the run kept nothing and the branch is
    still at the commit the run started from. Otherwise keep it and say why."""
    run, cfg = plan.run, plan.run.cfg
    name = cfg.branch
    if name not in [h.name for h in repo.heads]:
        return
    run_tree = Path(cfg.worktree).resolve()
    elsewhere = [p for p, b in trees if b == name and p != run_tree]
    kept = len(run.kept())
    if keep_branches:
        return
    if name != f"agent/{cfg.task}/{cfg.run_id}":
        plan.notes.append(f"kept branch {name}: not named agent/{cfg.task}/{cfg.run_id}")
    elif kept or run.state.best_iteration is not None:
        plan.notes.append(f"kept branch {name}: it holds {count(kept, 'kept commit', 'kept commits')} "
                          f"(`agent cherry-pick {run.id}` reads it)")
    elif elsewhere:
        plan.notes.append(f"kept branch {name}: it is checked out in {display(elsewhere[0])}")
    elif repo.heads[name].commit.hexsha != cfg.base_sha:
        plan.notes.append(f"kept branch {name}: it has commits the run did not start from")
    else:
        plan.branch = Step(f"branch {name}", 0, lambda: repo.git.branch("-D", name))


# --- small helpers ----------------------------------------------------------------------------
def tree_size(path: Path) -> int:
    """Bytes of the files under path; links are not followed."""
    total = 0
    for top, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(top, f)).st_size
            except OSError:
                pass
    return total


def human(n: int) -> str:
    """Bytes in decimal units, as du --si shows them."""
    if n < 1000:
        return f"{n} bytes"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def display(path: Path) -> str:
    """A path as the user typed it would look: relative to the current directory when under it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def one_line(e: Exception) -> str:
    if isinstance(e, git.GitCommandError):
        text = (e.stderr or str(e)).strip().removeprefix("stderr:").strip().strip("'")
    else:
        text = str(e)
    return " ".join(text.split())

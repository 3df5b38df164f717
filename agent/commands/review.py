"""`agent runs`, `agent show`, `agent report`, `agent cherry-pick`, `agent gate`: reviewing what the loop
logged and bringing its winners home. A log this agent cannot read is one red line and exit 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from agent.optimize import gitops
from agent.records.store import LogError
from tools.console import make_console


def err() -> Console:
    return make_console(stderr=True, highlight=False)


def out() -> Console:
    return make_console(highlight=False)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs, newest first")
    p.add_argument("--runs-dir", type=Path, help="where runs are (default: REPO/runs)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)

    s = sub.add_parser("show", help="a run's summary, or one iteration in full")
    s.add_argument("run", help="run id (or a unique prefix, or the run folder)")
    s.add_argument("--iter", type=int, metavar="N", help="show iteration N in full")
    s.add_argument("--transcript", action="store_true", help="with --iter: the iteration's conversation with the "
                   "model as it saw it (markdown, from the saved prompts and replies)")
    s.add_argument("--runs-dir", type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)

    r = sub.add_parser("report", help="write runs/RUN/report.md and speedup.png")
    r.add_argument("run")
    r.add_argument("--runs-dir", type=Path)
    r.set_defaults(func=cmd_report)

    c = sub.add_parser("cherry-pick", help="bring a run's kept commits onto your branch")
    c.add_argument("run")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--iter", type=int, metavar="N", help="only the kept commit of iteration N")
    which.add_argument("--best", action="store_true", help="every kept commit up to the best (the default)")
    c.add_argument("--onto", metavar="BRANCH", help="the branch to update (default: the current one); another "
                   "branch is updated in a temporary worktree, your checkout is not switched")
    c.add_argument("--squash", action="store_true", help="one commit listing the hypotheses and trailers")
    c.add_argument("--runs-dir", type=Path)
    c.set_defaults(func=cmd_cherry_pick)

    g = sub.add_parser("gate", help="CI check: parity, and no timing regression against a recorded best")
    g.add_argument("task", nargs="?", help="kernels/NAME (default: as for `agent optimize`)")
    g.add_argument("--against", metavar="RUN|COMMIT",
                   help="a run (its best commit) or a commit (default: the newest finished run of the task)")
    g.add_argument("--max-regression", default="2%", help="fail when the current code is clearly slower than this "
                   "(the speedup's 95%% CI high end below 1 - limit); default 2%%")
    g.add_argument("--runs-dir", type=Path)
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_gate)


def default_runs_dir(args) -> Path:
    if getattr(args, "runs_dir", None):
        return Path(args.runs_dir)
    try:
        return Path(gitops.open_repo(Path.cwd()).working_tree_dir) / "runs"
    except gitops.GitError:
        return Path.cwd() / "runs"


def _fail(msg: str, code: int = 2) -> int:
    err().print(f"[red]error[/red]: {escape(msg)}", soft_wrap=True)
    return code


def _load(args, say: bool = True):
    """The run, its notes (what could not be read: a torn or lost record, a damaged state) said first, a line each
    on stderr, unless `say` is False (JSON carries them)."""
    from agent.review.runs import load_run, resolve_run
    run = load_run(resolve_run(default_runs_dir(args), args.run))
    if say:
        _notes(run.notes)
    return run


def _notes(notes: list[str], prefix: str = "") -> None:
    for n in notes:
        err().print(f"[yellow]note[/yellow]: {escape(prefix + n)}", soft_wrap=True)


# --- runs / show / report ---------------------------------------------------------------------
def cmd_runs(args) -> int:
    from agent.review.runs import list_runs
    from agent.review.table import row, runs_table
    d = default_runs_dir(args)
    runs = list_runs(d)
    rows = [row(r) for r in runs]
    if not args.json:
        for r in runs:
            _notes(getattr(r, "notes", []), prefix=f"run {r.id}: ")
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return 0
    if not rows:
        err().print(f"no runs under {d} (start one with `agent optimize`)", markup=False)
        return 0
    out().print(runs_table(rows, f"runs in {d}"))
    return 0


def cmd_show(args) -> int:
    from agent.review import show
    if args.transcript and args.iter is None:
        return _fail("--transcript shows one iteration's conversation: add --iter N")
    try:
        run = _load(args, say=not args.json)
        rec = run.record(args.iter) if args.iter is not None else None
        if args.transcript:
            from agent.review.transcript import transcript
            print(transcript(run.dir, run.id, rec))
            return 0
    except LogError as e:
        return _fail(str(e))
    if args.json:
        data = show.iteration_json(run, rec) if rec else show.run_json(run)
        print(json.dumps(data, indent=2))
        return 0
    out().print(show.iteration_detail(run, rec) if rec else show.run_summary(run))
    return 0


def cmd_report(args) -> int:
    from agent.review.report import write_report
    try:
        run = _load(args)
    except LogError as e:
        return _fail(str(e))
    md, plots, note = write_report(run)
    if note:
        err().print(f"[yellow]note[/yellow]: {escape(note)}; the report was written without the plots")
    out().print(f"wrote {md}" + "".join(f" and {p}" for p in plots), markup=False)
    return 0


# --- cherry-pick ------------------------------------------------------------------------------
def cmd_cherry_pick(args) -> int:
    from agent.review.cherrypick import CherryPickError, cherry_pick
    try:
        run = _load(args)
        res = cherry_pick(run, Path.cwd(), iteration=args.iter, onto=args.onto, squash=args.squash)
    except (LogError, gitops.GitError) as e:
        return _fail(str(e))
    except CherryPickError as e:
        err().print(f"[red]cherry-pick refused[/red]: {escape(str(e))}", soft_wrap=True)
        return 1
    out().print(res.message, soft_wrap=True, markup=False)
    return 0


# --- gate -------------------------------------------------------------------------------------
def cmd_gate(args) -> int:
    from agent.review.gate import GateError, gate, parse_limit
    from agent.optimize.session import UsageError, choose_task
    try:
        limit = parse_limit(args.max_regression)
        task_dir, _ = choose_task(args.task, Path.cwd())
        res = gate(task_dir, against=args.against, limit=limit, runs_dir=args.runs_dir)
    except (LogError, gitops.GitError, UsageError, GateError) as e:
        return _fail(str(e))
    if args.json:
        print(res.model_dump_json(indent=2))
    else:
        color = "green" if res.passed else "red"
        out().print(f"[{color}]gate {'passed' if res.passed else 'FAILED'}[/{color}]: {escape(res.reason)}",
                    soft_wrap=True)
    return 0 if res.passed else 1

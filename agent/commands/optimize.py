"""`agent optimize`, `agent resume`, `agent sweep`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from agent.optimize import gitops
from agent.optimize.best import SetupFailed
from agent.records.figures import figures_line, times_line
from agent.review.plot import shorten
from agent.optimize.loop import Loop
from agent.records.schema import Decision
from agent.records.store import LogError, find_run, read_iterations
from agent.llm.settings import SettingsError
from agent.optimize.session import (Repaired, UsageError, check_limits, choose_task, default_proposer, parse_target,
                                    repair_run, repo_root_of, resume_run, start_run)
from agent.optimize.view import make_view
from tools.backends.backend import slow_rebuild_note
from tools.console import make_console
from tools.task import load_task


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="run the optimization loop on a task")
    p.add_argument("task", nargs="?", help="kernels/NAME (default: [tool.agent].task, else the first task that fits)")
    p.add_argument("--target", default="1.5x", help="speedup to reach vs the task's baseline, e.g. 1.5x (default)")
    p.add_argument("--past-target", action="store_true",
                   help="do not stop at the target: run every iteration (also where the initial kernel already "
                        "meets the target, which otherwise stops the run before the first iteration)")
    p.add_argument("--iters", type=int, default=20, help="iterations at most (default 20)")
    p.add_argument("--proposer", choices=["heuristic", "llm", "replay"],
                   help="default: llm if an endpoint is configured, else heuristic")
    p.add_argument("--baseline", choices=["reference", "initial"], help="override the task's baseline for --target")
    p.add_argument("--min-gain", type=float, help="minimum gain to keep a change (default: the task's, 0.02)")
    p.add_argument("--repairs", type=int, default=2,
                   help="a candidate that does not compile, is refused by the launch check or fails parity goes back "
                        "to the model with the error this often within its iteration (default 2; llm only)")
    p.add_argument("--candidates", type=int, default=1, metavar="K",
                   help="proposals per iteration, evaluated side by side; the fastest that passes is confirmed and "
                        "kept (default 1; with K > 1 no repairs)")
    p.add_argument("--at-once", action="store_true",
                   help="with --candidates K and a model: send the K requests at once, each asked for its rank among "
                        "K (1 = the most promising) instead of being told the proposals before it")
    spread = p.add_mutually_exclusive_group()
    spread.add_argument("--workers", type=int, metavar="N",
                        help="evaluate an iteration's candidates on N local dask workers, one per GPU (docs/SCALE.md)")
    spread.add_argument("--scheduler", metavar="ADDRESS", help="... on the workers of a running dask scheduler")
    p.add_argument("--replay", metavar="RUN", help="replay proposer: the run (or proposals file) to replay")
    p.add_argument("--kept-only", action="store_true", help="replay only the proposals that run kept")
    p.add_argument("--model", help="LLM model name")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint")
    p.add_argument("--budget-tokens", type=int, help="stop cleanly when the LLM has used this many tokens")
    p.add_argument("--budget-usd", type=float, help="stop cleanly when the LLM has cost this much")
    p.add_argument("--budget-seconds", type=float, help="stop cleanly after this much wall time")
    p.add_argument("--tier", type=int, choices=[1, 2], default=1, help="profile tier for the best (default 1)")
    p.add_argument("--profile-rejected", action=argparse.BooleanOptionalAction, default=None,
                   help="profile a GPU candidate rejected as not faster or inconclusive too, so that the model reads "
                        "why (one Nsight Compute pass, about 7 s on an H200; default: on with --proposer llm)")
    p.add_argument("--run-id", help="name of the run (default: timestamp)")
    p.add_argument("--runs-dir", type=Path, help="where runs go (default: REPO/runs)")
    p.add_argument("--quiet", action="store_true", help="no live view, summary only")
    p.set_defaults(func=cmd_optimize)

    r = sub.add_parser("resume", help="continue a run that was interrupted or killed")
    r.add_argument("run", help="run id (or a unique prefix)")
    r.add_argument("--runs-dir", type=Path)
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--repair", action="store_true",
                   help="only make the run's records whole (a torn or damaged record set aside, a kept iteration "
                        "whose record is missing rebuilt from its commit), without going on; a finished run too")
    r.set_defaults(func=cmd_resume)

    s = sub.add_parser("sweep", help="measure every knob configuration the restrictions allow")
    s.add_argument("task", nargs="?")
    s.add_argument("--limit", type=int, help="measure a random sample of this many configurations")
    s.add_argument("--seed", type=int, default=0, help="seed of the --limit sample (default 0)")
    s.add_argument("--jobs", type=int, help="parallel builds (default: the CPU count)")
    s.add_argument("--batch", type=int, default=16,
                   help="configurations per evaluation process (default 16; a crash costs one configuration); "
                        "the screen's short timings run 4 times as many per process")
    s.add_argument("--screen", type=int, metavar="K",
                   help="rank every configuration by a short timing alone first; only the K fastest get parity and bench")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help="evaluate on N local dask workers, one per GPU (a CPU task: a share of the cores each); "
                            "default: here, one configuration at a time")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="evaluate on the workers of a running dask scheduler (tcp://HOST:8786; docs/SCALE.md)")
    s.add_argument("--runs-dir", type=Path)
    s.add_argument("--json", action="store_true", help="print the SweepResult as JSON on stdout")
    s.set_defaults(func=cmd_sweep)


def _llm_overrides(args) -> dict:
    vals = {"model": args.model, "base_url": args.base_url, "budget_tokens": args.budget_tokens,
            "budget_usd": args.budget_usd}
    return {k: v for k, v in vals.items() if v is not None}


def cmd_optimize(args) -> int:
    console = make_console(stderr=True)
    try:
        check_limits(args.iters, args.min_gain, args.budget_seconds, args.budget_tokens, args.budget_usd)
        if args.repairs < 0:
            raise UsageError(f"--repairs {args.repairs}: give 0 or more (0: a failed candidate ends its iteration)")
        if args.candidates < 1 or (args.workers is not None and args.workers < 1):
            raise UsageError("--candidates and --workers: give 1 or more")
        if (args.workers or args.scheduler) and args.candidates < 2:
            raise UsageError("--workers and --scheduler spread an iteration's candidates: give --candidates K (2 or more)")
        if args.at_once and args.candidates < 2:
            raise UsageError("--at-once sends an iteration's K model requests together: give --candidates K (2 or more)")
        target = parse_target(args.target)
        task_dir, why = choose_task(args.task, Path.cwd())
        overrides = _llm_overrides(args)
        root = repo_root_of(task_dir)
        kind = args.proposer or default_proposer(root, overrides)
        if args.at_once and kind != "llm":
            raise UsageError(f"--at-once sends a model's requests together; the {kind} proposer asks no model")
        console.print(f"{why}; proposer {kind}" + ("" if args.proposer else " (default)"), highlight=False,
                      markup=False)
        note = slow_rebuild_note(load_task(task_dir))
        if note:
            console.print(f"[yellow]note[/yellow]: {escape(note)}", highlight=False)
        extra = {"llm_overrides": overrides, "model": args.model, "replay_source": args.replay,
                 "replay_kept_only": args.kept_only}
        view = make_view(console, quiet=args.quiet)
        loop = start_run(task_dir, target=target, iters=args.iters, proposer_kind=kind, view=view,
                         baseline=args.baseline, min_gain=args.min_gain, run_id=args.run_id, runs_dir=args.runs_dir,
                         budget_seconds=args.budget_seconds, budget_tokens=args.budget_tokens,
                         budget_usd=args.budget_usd, profile_tier=args.tier, extra=extra,
                         past_target=args.past_target, repairs=args.repairs, candidates=args.candidates,
                         workers=args.workers, scheduler=args.scheduler, at_once=args.at_once,
                         profile_rejected=args.profile_rejected)
        return _run_and_summarize(loop)
    except (UsageError, gitops.GitError, LogError, SettingsError) as e:
        console.print(f"[red]error[/red]: {escape(str(e))}", highlight=False)
        return 2
    except SetupFailed as e:   # the compiler's or the parity check's own words: escaped, never markup
        console.print(f"[red]cannot start[/red]: {escape(str(e))}", highlight=False)
        return 1


def cmd_resume(args) -> int:
    console = make_console(stderr=True)
    try:
        root = repo_root_of(Path.cwd())
        run_dir = find_run(args.runs_dir.parent if args.runs_dir else root, args.run) if not args.runs_dir \
            else args.runs_dir / args.run
        if args.repair:
            repair_run(run_dir, make_view(console), only=True)
        loop = resume_run(run_dir, make_view(console, quiet=args.quiet))
        return _run_and_summarize(loop)
    except Repaired as e:
        console.print(escape(str(e)), highlight=False)
        return 0
    except (UsageError, gitops.GitError, LogError) as e:
        console.print(f"[red]error[/red]: {escape(str(e))}", highlight=False)
        return 2


def _run_and_summarize(loop: Loop) -> int:
    state = loop.run()
    recs = read_iterations(loop.run_dir)
    t = Table(title=escape(f"run {loop.cfg.run_id}: {state.stop_reason}"), show_lines=False)
    for c in ("#", "decision", "speedup vs best", "hypothesis", "reason"):
        t.add_column(c, overflow="fold")
    for r in recs:
        b = r.bench.speedup_vs_baseline if r.bench else None
        # the model's hypothesis and the compiler's or parity's reason: text, not markup
        t.add_row(str(r.iteration), r.decision.value, f"{b.median:.3f}x" if b else "-",
                  Text(shorten(r.proposal.summary(), 60) if r.proposal else "-"), Text(shorten(r.reason, 80)))
    out = make_console()
    out.print(t)
    kept = [r for r in recs if r.decision == Decision.kept]
    best = state.best_sha[:10]
    out.print(
        f"best: {times_line(state)}\nspeedup: {figures_line(state)}\n"
        f"{len(kept)} kept of {len(recs)}; best commit {best} on branch {loop.cfg.branch}\n"
        + (f"review: agent show {loop.cfg.run_id}   cherry-pick: agent cherry-pick {loop.cfg.run_id} --best" if kept
           else f"nothing was kept: review with agent show {loop.cfg.run_id}; agent clean {loop.cfg.run_id} removes "
                "its worktree and branch"),
        highlight=False, markup=False)
    return 130 if state.status == "interrupted" else 0


def cmd_sweep(args) -> int:
    from agent.evaluation.ended import IterationEnded
    from agent.sweep.points import describe
    from agent.sweep.run import sweep
    from tools.judge.batch import BatchError
    console = make_console(stderr=True)
    try:
        task_dir, why = choose_task(args.task, Path.cwd())
    except UsageError as e:
        console.print(f"[red]error[/red]: {escape(str(e))}")
        return 2
    if any(v is not None and v < 1 for v in (args.jobs, args.batch, args.screen, args.workers)):
        console.print("[red]error[/red]: --jobs, --batch, --screen and --workers must be at least 1")
        return 2
    task = load_task(task_dir)
    from agent.evaluation.executor import ExecutorError, make_executor
    try:
        ex = make_executor(args.workers, args.scheduler, task.backend.gpu)
    except ExecutorError as e:
        console.print(f"[red]error[/red]: {escape(str(e))}", highlight=False)
        return 2
    root = repo_root_of(task_dir)
    from datetime import datetime
    out = (args.runs_dir or root / "runs") / f"sweep-{task.name}-{datetime.now():%Y%m%d-%H%M%S}"
    gitops.ensure_runs_ignored(gitops.open_repo(root), out.parent)
    console.print(f"{why}; {len(task.spec.knob_space())} configurations allowed; evaluated on {ex.where}; results in "
                  f"{out}", highlight=False, markup=False)

    def progress(n, total, p):
        vs = f" ({p.speedup_vs_initial:.2f}x)" if p.speedup_vs_initial is not None else ""
        what = f"{p.median_ms * 1e3:.1f} us{vs}" if p.ok else f"{p.outcome}: {p.reason[:80]}"
        on = f" on {p.worker}" if p.worker else ""
        console.print(f"[{n}/{total}] {p.knobs} {what}{on}", highlight=False, markup=False)

    try:
        res = sweep(task, out, limit=args.limit, seed=args.seed, progress=progress, jobs=args.jobs,
                    batch=args.batch, screen=args.screen, executor=ex,
                    log=lambda line: console.print(line, highlight=False, markup=False))
    except KeyboardInterrupt:
        console.print(f"interrupted; the configurations measured so far are in {out / 'sweep.json'}", highlight=False,
                      markup=False)
        return 130
    except IterationEnded as e:   # the initial configuration is the bar: it must build, pass and time
        console.print(f"[red]the initial configuration failed[/red]: {escape(e.reason)}", highlight=False)
        return 1
    except BatchError as e:       # the evaluation child could not load the task or the initial library
        console.print(f"[red]sweep failed[/red]: {escape(str(e))}", highlight=False)
        return 1
    finally:
        ex.close()
    if args.json:
        print(res.model_dump_json(indent=2))
    else:
        make_console().print(describe(res), highlight=False, markup=False)
    return 0 if res.best() else 1

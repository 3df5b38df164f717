"""Starting and resuming runs: choose the task and the proposer, create the branch and worktree,
write run.json, measure the initial kernel; or re-attach to a run from its log and branch."""

from __future__ import annotations

import difflib
import secrets
import tomllib
from datetime import datetime
from pathlib import Path

from rich.markup import escape

from agent.optimize import gitops
from agent.records.envinfo import fingerprint
from agent.optimize.best import SetupFailed
from agent.optimize.loop import Loop
from agent.optimize.revoke import Answered, unchecked_best
from agent.proposers.base import Proposer
from agent.proposers.retry import RetryFirst, is_retry, undecided
from agent.evaluation.evaluate import snapshot_lib
from agent.records.recover import mend_records
from agent.records.schema import Decision, RunConfig, RunState, StageTimes, now
from agent.records.store import LogError, hold_run, read_config, read_state, write_json_atomic
from agent.optimize.view import View
from tools.build.reuse import latest_builds
from tools.task import Task, first_fitting_task, load_task


class UsageError(Exception):
    """Bad command-line input: one line for the user."""


def parse_target(text: str) -> float:
    t = text.strip().lower().removesuffix("x")
    try:
        v = float(t)
    except ValueError:
        raise UsageError(f"--target {text!r}: give a speedup such as 1.5x or 1.5") from None
    if not v > 1:
        raise UsageError(f"--target {text}: a target at or below 1x is met before the first iteration; "
                         "give more than 1, e.g. 1.5x")
    return v


def load_run(run_dir: Path) -> tuple[RunConfig, RunState]:
    cfg = read_config(run_dir)
    st = read_state(run_dir)
    if st.status == "unknown":
        raise LogError(f"{run_dir}: no state.json; the run never measured its initial kernel")
    return cfg, st


def check_limits(iters: int, min_gain: float | None = None, budget_seconds: float | None = None,
                 budget_tokens: int | None = None, budget_usd: float | None = None) -> None:
    """The run's numbers, refused before anything is created (a run folder, a branch, a worktree)."""
    if iters < 1:
        raise UsageError(f"--iters {iters}: give at least 1")
    if min_gain is not None and not min_gain >= 0:
        raise UsageError(f"--min-gain {min_gain:g}: give 0 or more (0.02 keeps a change 2% faster)")
    for flag, v in (("--budget-seconds", budget_seconds), ("--budget-tokens", budget_tokens),
                    ("--budget-usd", budget_usd)):
        if v is not None and not v > 0:
            raise UsageError(f"{flag} {v:g}: give more than 0, or leave it out for no budget")


def repo_root_of(path: Path) -> Path:
    return Path(gitops.open_repo(path).working_tree_dir)


def choose_task(arg: str | None, cwd: Path) -> tuple[Path, str]:
    """The task folder and a sentence saying why it was chosen."""
    if arg:
        p = Path(arg) if Path(arg).is_absolute() else cwd / arg
        if not p.exists() and (cwd / "kernels" / arg).exists():
            p = cwd / "kernels" / arg
        if not p.is_dir():
            if p.exists():
                raise UsageError(f"{arg} is a file, not a task folder")
            near = _near_task(arg, cwd)
            raise UsageError(f"{arg} does not exist: " + (f"did you mean {near}?" if near else
                             "give a task folder (one holding task.toml), e.g. kernels/matmul_cpu"))
        if not (p / "task.toml").is_file():
            raise UsageError(f"{arg} has no task.toml: give a task folder, e.g. kernels/matmul_cpu")
        return p.resolve(), f"task {p.name} (from the command line)"
    try:
        root = repo_root_of(cwd)
    except gitops.GitError:
        root = cwd
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        conf = tomllib.loads(pyproject.read_text()).get("tool", {}).get("agent", {})
        if conf.get("task"):
            p = (root / conf["task"]) if "/" in conf["task"] else root / "kernels" / conf["task"]
            return p.resolve(), f"task {p.name} (from [tool.agent] in pyproject.toml)"
    from tools.backends.device import torch_cuda_available
    cuda = torch_cuda_available()
    chosen = first_fitting_task(root / "kernels", cuda)
    if chosen is None:
        raise UsageError(f"no task given and no kernels/*/task.toml under {root} fits this machine "
                         "(a cuda task needs a GPU)")
    dev = load_task(chosen).spec.device
    why = "a GPU is present" if cuda else "no GPU here"
    return chosen.resolve(), f"task {chosen.name} (first shipped {dev} task; {why})"


def _near_task(arg: str, cwd: Path) -> str | None:
    """The task folder beside the one typed whose name is closest to it (aider's "did you mean"), written
    as the user wrote the argument: a typo in the last part of the path is the common one."""
    typed = Path(arg)
    for parent in (typed.parent, Path("kernels") / typed.parent):   # kernels/ARG is taken too (above)
        where = parent if parent.is_absolute() else cwd / parent
        names = sorted(t.parent.name for t in where.glob("*/task.toml"))
        near = difflib.get_close_matches(typed.name, names, 1)
        if near:
            return str(typed.parent / near[0])
    return None


def make_proposer(kind: str, task: Task, cfg_extra: dict, repo_root: Path) -> Proposer:
    if kind == "heuristic":
        from agent.proposers.heuristic import HeuristicProposer
        return HeuristicProposer(task)
    if kind == "replay":
        from agent.proposers.replay import ReplayProposer
        src = cfg_extra.get("replay_source")
        if not src:
            raise UsageError("--proposer replay needs --replay RUN_ID (or a proposals .json/.jsonl file)")
        p = Path(src)
        if not p.exists():
            p = repo_root / "runs" / src
        if not p.exists():
            raise UsageError(f"--replay {src}: no such run or file")
        return ReplayProposer(p, kept_only=bool(cfg_extra.get("replay_kept_only")))
    if kind == "llm":
        from agent.llm.proposer import LLMProposer
        from agent.llm.settings import load_llm_settings
        settings = load_llm_settings(cfg_extra.get("llm_overrides", {}), repo_root)
        if settings is None:
            raise UsageError("--proposer llm needs an endpoint: --base-url/--model, AGENT_BASE_URL/AGENT_MODEL, or "
                             "[tool.agent] in pyproject.toml (see docs/LLM.md)")
        return LLMProposer(settings, task, spent=cfg_extra.get("spent"), profile_view=_compact_view)
    raise UsageError(f"unknown proposer {kind!r} (heuristic, llm, replay)")


def _compact_view(report) -> str:
    from tools.profile import compact
    return compact(report) if report is not None else "(no profile: Nsight Compute unavailable or it failed)"


def default_proposer(repo_root: Path, overrides: dict) -> str:
    try:
        from agent.llm.settings import load_llm_settings
    except ImportError:
        return "heuristic"
    return "llm" if load_llm_settings(overrides, repo_root) is not None else "heuristic"


def link_earlier_builds(loop: Loop, run_dir: Path) -> None:
    """The latest earlier builds of the task (agent check's, earlier runs') offer their objects of
    the same bytes to this run's builds, linked where still valid (tools/build/reuse.py): a torch extension's
    binding, 20-35 s, compiled once per machine rather than once per run, and the run's first build of a file
    that includes torch's headers (11-25 s) linked from `agent check`'s build of the same bytes."""
    loop.evaluator.reuse_objects = latest_builds(loop.task, run_dir.parent, exclude=run_dir / "build")


def start_run(task_dir: Path, *, target: float, iters: int, proposer_kind: str, view: View,
              baseline: str | None = None, min_gain: float | None = None, run_id: str | None = None,
              runs_dir: Path | None = None, budget_seconds: float | None = None, budget_tokens: int | None = None,
              budget_usd: float | None = None, profile_tier: int = 1, extra: dict | None = None,
              past_target: bool = False, repairs: int = 2, candidates: int = 1, workers: int | None = None,
              scheduler: str | None = None, at_once: bool = False, profile_rejected: bool | None = None) -> Loop:
    extra = extra or {}
    task = load_task(task_dir)        # validate before touching anything
    repo = gitops.open_repo(task.root)
    root = Path(repo.working_tree_dir)
    task_rel = task.root.resolve().relative_to(root.resolve()).as_posix()
    try:
        repo.git.cat_file("-e", f"HEAD:{task_rel}/task.toml")
    except Exception:
        raise UsageError(f"{task_rel} is not committed at HEAD: the run starts from your HEAD; commit the task first") from None
    dirty = repo.git.status("--porcelain", "--", task_rel)
    if dirty:
        view.message(f"[yellow]note[/yellow]: {escape(task_rel)} has uncommitted changes; the run starts from HEAD "
                     "(commit them to include them). Your working tree is not touched.")
    run_id = run_id or datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
    runs = (runs_dir or root / "runs").resolve()
    run_dir = runs / run_id
    if run_dir.exists():
        raise UsageError(f"run folder {run_dir} already exists")
    run_dir.mkdir(parents=True)
    hold_run(run_dir)
    if gitops.ensure_runs_ignored(repo, runs):
        view.message(f"note: added /{escape(runs.relative_to(root).as_posix())}/ to .git/info/exclude so runs never "
                     "show in your git status")
    branch = f"agent/{task.name}/{run_id}"
    base = repo.head.commit.hexsha
    rgit = gitops.RunGit.create(repo, run_dir / "worktree", branch, run_id, base)
    proposer = make_proposer(proposer_kind, task, extra, root)
    cfg = RunConfig(run_id=run_id, task=task.name, task_dir=task_rel, repo=str(root), branch=branch, base_sha=base,
                    worktree=str(rgit.worktree), proposer=proposer_kind, model=extra.get("model"), target=target,
                    past_target=past_target, iters=iters, baseline=baseline or task.spec.baseline,
                    min_gain=task.spec.bench.min_gain if min_gain is None else min_gain,
                    budget_tokens=budget_tokens, budget_usd=budget_usd, budget_seconds=budget_seconds, repairs=repairs,
                    candidates=candidates, workers=workers, scheduler=scheduler, at_once=at_once,
                    profile_tier=profile_tier, started=now(), env=fingerprint(repo),
                    # a model reads a rejected candidate's profile; the heuristic and a replay read none
                    profile_rejected=proposer_kind == "llm" if profile_rejected is None else profile_rejected,
                    extra={k: v for k, v in extra.items() if k != "llm_overrides"})
    write_json_atomic(run_dir / "run.json", cfg)
    loop = Loop(run_dir, cfg, rgit, proposer, view)
    link_earlier_builds(loop, run_dir)
    try:
        loop.best.measure_initial(rgit.head())
    except SetupFailed:
        loop.finish("failed", "the initial kernel could not be measured")
        raise
    return loop


def prepare_resume(loop: Loop) -> None:
    """Bring the run's branch back to the best recorded commit, rebuild the best's library and reload
    its profile, so that the loop can go on from its log."""
    head = loop.git.head()
    n = max((r.iteration for r in loop.records), default=0)   # not the count: a damaged line set aside leaves a gap
    if head != loop.state.best_sha:
        loop.git.keep_ref("interrupted", n + 1, head)
    # reset even when HEAD is the best: a SIGKILL between patch and commit leaves the candidate's
    # edit uncommitted in the worktree, and the resumed run would build on top of it
    loop.git.reset_to(loop.state.best_sha)
    if (pending := unchecked_best(loop)) is not None:    # killed while they ran: run now, and the keep may not stand
        what = ", ".join(pending.later.checks)
        loop.view.message(f"iteration {pending.rec.iteration}'s {what} after its keep " + (
            "refused it, and the run stopped before the keep was revoked: revoking it now" if isinstance(
                pending.later, Answered) else "had not answered when the run was stopped: running it again first"))
        pending.settle(loop)
    loop.state.iterations_done = n
    loop.state.status = "running"
    loop.reload_task()
    # always rebuilt: a SIGKILL during a keep may have left the candidate's
    # library at best/ while state.json still names the parent as the best
    b = loop.evaluator.build(StageTimes())
    snapshot_lib(b.lib_path, loop.best.lib)
    last = next((loop.run_dir / f"iter-{r.iteration}" for r in reversed(loop.records)
                 if r.decision == Decision.kept), loop.run_dir / "initial")
    loop.best.load_profile(last / "profile.json")
    loop.best.save()


class Repaired(Exception):
    """A finished run (or `--repair`): its records were mended, and there is nothing to run. The message says so."""


def repair_run(run_dir: Path, view: View, only: bool = False) -> None:
    """The records of a run that will not go on (finished, failed at setup, or `agent resume --repair`) made whole
    (agent/records/recover.py repair), each step said. Raises Repaired (done: exit 0) or UsageError (a finished run with
    nothing to mend, as before)."""
    cfg, state = load_run(run_dir)
    hold_run(run_dir)
    repo = gitops.open_repo(Path(cfg.repo))
    going = state.status not in ("done", "failed")   # a run that can go on: a keep the kill interrupted is mended too
    _, said = mend_records(run_dir, cfg, state, repo,
                           gitops.RunGit.attach(repo, Path(cfg.worktree), cfg.branch, cfg.run_id) if going else None)
    for line in said:
        view.message(escape(line))
    why = {"done": "is finished", "failed": "failed at setup"}.get(state.status)
    if only or said:
        raise Repaired(f"run {cfg.run_id}: " + ("its records were repaired" if said else "its records are whole")
                       + (f"; it {why} ({state.stop_reason}): nothing to resume" if why else
                          f"; `agent resume {cfg.run_id}` goes on with it"))
    raise UsageError(f"run {cfg.run_id} {why} ({state.stop_reason}); start a new one")


def resume_run(run_dir: Path, view: View, extra: dict | None = None) -> Loop:
    cfg, state = load_run(run_dir)
    if state.status in ("done", "failed"):
        repair_run(run_dir, view)   # raises: a power cut can leave a finished run's last kept record missing
    hold_run(run_dir)
    repo = gitops.open_repo(Path(cfg.repo))
    rgit = gitops.RunGit.attach(repo, Path(cfg.worktree), cfg.branch, cfg.run_id)
    for f in rgit.clear_stale_locks():
        view.message(f"removed {escape(str(f))}: left by a git command the killed run did not finish")
    state, said = mend_records(run_dir, cfg, state, repo, rgit)   # a torn or lost record, an interrupted keep
    for line in said:
        view.message(escape(line))
    task = load_task(Path(cfg.worktree) / cfg.task_dir)
    merged = {**cfg.extra, **(extra or {})}
    merged["spent"] = state.usage
    proposer = make_proposer(cfg.proposer, task, merged, Path(cfg.repo))
    loop = Loop(run_dir, cfg, rgit, proposer, view)
    link_earlier_builds(loop, run_dir)
    prepare_resume(loop)
    proposer.skip_to(sum(1 for r in loop.records if r.proposal is not None and not is_retry(r.proposal)))
    again = undecided(loop.records)
    if again is not None:
        loop.proposer = RetryFirst(proposer, again)
        view.message(f"iteration {again.iteration} was interrupted before its candidate was decided: "
                     f"evaluating it again first ({escape(again.proposal.summary()[:80])})")
    view.message(f"resuming {escape(cfg.run_id)} at iteration {loop.state.iterations_done + 1} of {cfg.iters} "
                 f"(best {'initial' if loop.state.best_iteration is None else 'iteration ' + str(loop.state.best_iteration)})")
    return loop


__all__ = ["start_run", "resume_run", "repair_run", "Repaired", "choose_task", "parse_target", "check_limits", "UsageError"]

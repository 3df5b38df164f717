"""`agent gate TASK [--against RUN|COMMIT] [--max-regression 2%]`: for CI.

Builds the task as it is in the working tree, checks parity, and times its main shape interleaved
(ABAB) against a recorded best: a run's best commit (default: the newest finished run of the task)
or any commit, whose task sources are taken with `git archive` into a temporary folder and built
there. It fails on a parity failure, or when the speedup's 95% interval lies wholly below
1 - limit in two independent benches (a clear regression: noise alone does not fail CI; where the
first two disagree, a third decides). Uses the loop's Evaluator pipeline.
A pass says faster or slower only where two independent benches both put the interval beyond the
task's keep band (bench.min_gain, 2%), else no significant change.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel

from agent.evaluation.attempt import Attempt
from agent.evaluation.ended import CompileFailed, IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.review.runs import Run, list_runs, load_run, resolve_run
from agent.records.schema import StageTimes
from agent.records.store import LogError
from tools.results import ParityResult, SpeedupCI
from tools.task import Task, load_task, shape_label


class GateError(Exception):
    """The gate could not run (bad arguments, no baseline, the baseline does not build): exit 2."""


class GateResult(BaseModel):
    task: str
    against: str                       # what the user named (or the default run)
    against_kind: str                  # run | commit
    against_sha: str
    limit: float
    passed: bool
    status: str                        # ok | compile_failed | launch_rejected | parity_failed | bench_failed | regression
    reason: str                        # one line
    shape: str = ""
    speedup: SpeedupCI | None = None   # baseline time / current time
    speedup_again: SpeedupCI | None = None   # the same from a second, independent bench (a fresh child)
    speedup_third: SpeedupCI | None = None   # a third, only where one of the two said regression and the other not
    current_ms: float | None = None
    baseline_ms: float | None = None
    parity: ParityResult | None = None
    seconds: dict[str, float] = {}


def parse_limit(text: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise GateError(f"--max-regression {text!r}: give a percentage such as 2% (or a fraction such as 0.02)") \
            from None
    if not 0 <= v < 1:
        raise GateError(f"--max-regression {text!r}: must be at least 0% and below 100%")
    return v


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True)


def repo_root(path: Path) -> Path:
    from tools.isolation.checkout import checkout_of
    root = checkout_of(path)
    if root is None:
        raise GateError(f"{path} is not inside a git repository: the gate compares against a recorded commit")
    return root


def newest_finished_run(runs_dir: Path, task: str) -> Run:
    for r in list_runs(runs_dir):
        if isinstance(r, Run) and r.cfg.task == task and r.state.status == "done" and r.state.best_sha:
            return r
    raise GateError(f"no finished run of task {task} under {runs_dir}; name a baseline with --against RUN|COMMIT")


def resolve_against(root: Path, runs_dir: Path, task: Task, against: str | None) -> tuple[str, str, str, str]:
    """(label, kind, sha, task folder relative to the repository root in that commit)."""
    here = task.root.resolve().relative_to(root.resolve()).as_posix()
    if against is None:
        run = newest_finished_run(runs_dir, task.name)
    else:
        try:
            run = load_run(resolve_run(runs_dir, against))
        except LogError as e:
            if not str(e).startswith("no run "):
                raise
            run = None
            p = _git(root, "rev-parse", "--verify", "-q", f"{against}^{{commit}}")
            if p.returncode != 0:
                raise GateError(f"--against {against}: neither a run under {runs_dir} nor a commit") from None
            return against, "commit", p.stdout.decode().strip(), here
    if run.cfg.task != task.name:
        raise GateError(f"run {run.id} optimized task {run.cfg.task}, not {task.name}")
    if not run.state.best_sha:
        raise GateError(f"run {run.id} recorded no best commit (status {run.state.status})")
    best = "initial" if run.state.best_iteration is None else f"iteration {run.state.best_iteration}"
    return f"run {run.id} best ({best})", "run", run.state.best_sha, run.cfg.task_dir


def export_task(root: Path, sha: str, task_rel: str, dest: Path) -> Task:
    """The task folder as it is in commit `sha`, written under dest (git archive, no checkout)."""
    p = _git(root, "archive", "--format=tar", sha, "--", task_rel)
    if p.returncode != 0:
        msg = p.stderr.decode().strip().splitlines()
        raise GateError(f"commit {sha[:10]} has no {task_rel}: {msg[-1] if msg else 'git archive failed'}")
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tf:
        tf.extractall(dest, filter="data")
    return load_task(dest / task_rel)


def _limits(task: Task):
    return task.backend.limits(task.spec.build.arch)


def below(s: SpeedupCI | None, limit: float) -> bool:
    """One bench's regression: its 95% interval wholly below 1 - limit."""
    return s is not None and s.high < 1 - limit


def regressed(benches: list[SpeedupCI | None], limit: float) -> bool:
    """The gate's rule: two of the independent benches (two, or three where the first two disagreed) regressed."""
    return sum(below(s, limit) for s in benches) >= 2


def gate(task_dir: Path, against: str | None, limit: float, runs_dir: Path | None = None) -> GateResult:
    task = load_task(task_dir)
    root = repo_root(task.root)
    runs = runs_dir or root / "runs"
    label, kind, sha, task_rel = resolve_against(root, runs, task, against)
    tmp = Path(tempfile.mkdtemp(prefix="agent-gate-"))
    lib_name = f"lib{task.name}.so"
    times = StageTimes()
    res = GateResult(task=task.name, against=label, against_kind=kind, against_sha=sha, limit=limit, passed=False,
                     status="ok", reason="", shape=shape_label(task.spec.main))
    try:
        base_task = export_task(root, sha, task_rel, tmp / "baseline-src")
        limits = _limits(task)
        cur = Evaluator(task, tmp / "build-current", limits, checkout=root)   # modes watched (tools/isolation/checkout.py)
        base = Evaluator(base_task, tmp / "build-baseline", limits, checkout=root)
        try:
            b = cur.build(times)
        except CompileFailed as e:
            return _failed(res, e, times)
        lib = snapshot_lib(b.lib_path, tmp / "current" / lib_name)
        try:
            bb = base.build(StageTimes())
            base_lib = snapshot_lib(bb.lib_path, tmp / "baseline" / lib_name)
        except IterationEnded as e:
            raise GateError(f"the baseline ({label}, {sha[:10]}) does not build: {e.reason}") from None
        # the pipeline every candidate goes through: launch check, parity, the bench against the baseline
        a = Attempt(iteration=0, run_id="gate", started="", parent_sha=sha)
        try:
            cur.evaluate_candidate(lib, base_lib, times, into=a, launch_context=cur.launch_context(b, None),
                                   verify_launch=True, memcheck=True)
        except IterationEnded as e:
            e.fill(a)
            res.parity = a.parity
            return _failed(res, e, times)
        res.parity, bench = a.parity, a.bench
        # a change is called only where two independent benches agree: one bench of a few rounds
        # excludes 1 for identical code now and then, more often on a loaded machine
        try:
            second = cur.bench(lib, base_lib, times)[0]
            # one bench says regression, the other cannot tell (a loaded machine widened its interval: a planted 2.7x
            # regression measured 0.370x [0.349, 0.389] and 0.425x [0.242, 1.053] and passed): a third decides
            pair = [bench.speedup_vs_baseline, second.speedup_vs_baseline]
            third = cur.bench(lib, base_lib, times)[0] if sum(below(s, limit) for s in pair) == 1 else None
        except IterationEnded as e:
            return _failed(res, e, times)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ci, again = bench.speedup_vs_baseline, second.speedup_vs_baseline
    t = third.speedup_vs_baseline if third is not None else None
    c, bt = bench.timing("candidate"), bench.timing("baseline")
    res.speedup, res.speedup_again, res.speedup_third = ci, again, t
    res.current_ms, res.baseline_ms = c.median_ms if c else None, bt.median_ms if bt else None
    res.seconds = {k: round(v, 2) for k, v in times.model_dump().items() if v}
    checks = len(res.parity.checks) if res.parity else 0
    vs = (f"{ci.median:.3f}x and {again.median:.3f}x vs {label} {sha[:10]} in two independent benches (95% CIs "
          f"{ci.low:.3f}-{ci.high:.3f} and {again.low:.3f}-{again.high:.3f})")
    both = lambda test: test(ci) and test(again)   # noqa: E731
    if regressed([ci, again, t], limit):
        res.status = "regression"
        third_said = (f"; a third, taken because they disagreed, {t.median:.3f}x (95% CI {t.low:.3f}-{t.high:.3f})"
                      if t is not None else "")
        res.reason = (f"{task.name} regressed: {vs}{third_said}; its median time is {1 / ci.median:.2f}x the "
                      f"baseline's, beyond the {limit:.0%} limit")
        return res
    res.passed = True
    either = lambda test: test(ci) or test(again)   # noqa: E731
    # a change is called beyond the task's keep band (bench.min_gain, 2%) only: two builds of the same code
    # differ for real by a percent or two where their code lands, and both benches of an A/A then exclude 1
    # (1.020x [1.000, 1.050] and 1.042x [1.004, 1.121] for the best against itself on a 2-core machine)
    band = task.spec.bench.min_gain
    up, down = (lambda s: s.low > 1 + band), (lambda s: s.high < 1 - band)
    change = ("faster" if both(up) else "slower, within the limit" if both(down)
              else f"no significant change (one bench saw one beyond {band:.0%}, the other did not)"
              if either(lambda s: up(s) or down(s)) else f"no significant change (none beyond {band:.0%})")
    res.reason = f"{task.name}: parity ok ({checks} checks); {vs}: {change}, within the {limit:.0%} limit"
    return res


def _failed(res: GateResult, e: IterationEnded, times: StageTimes) -> GateResult:
    res.status = e.outcome.value
    res.reason = f"{res.task}: {' '.join(e.reason.split())[:300]}"
    res.seconds = {k: round(v, 2) for k, v in times.model_dump().items() if v}
    return res

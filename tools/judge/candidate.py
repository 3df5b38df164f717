"""The candidate check in one child process (launch plan check, parity, bench), and the child started
ahead of time so that its start-up (torch, the CUDA context) overlaps the candidate's build."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

from tools.measure.bench import failed_bench
from tools.measure.parity import child_failure, child_status
from tools.judge.budgets import StageClock
from tools.judge.sanitize import SANITIZERS, allowed_unchecked
from tools.results import BenchResult, LaunchResult, LaunchStatus, ParityResult, ParityStatus, StageBudget
from tools.backends.jitcache import judge_env
from tools.isolation.sandbox import STAGE_MARK, Prestarted, ProcStatus, child_json, prestart_python
from tools.task import Task


class CandidateChecks(NamedTuple):
    """What the evaluate child answered: each part None when an earlier one failed (or, for launch,
    when no launch context was given)."""
    launch: LaunchResult | None
    parity: ParityResult | None
    bench: list[BenchResult] | None
    dropped_bytes: int = 0     # the child's output (the candidate's prints among it) past the capture's cap


def prestart_candidate(task: Task, scratch_root: Path | None = None, sanitize_early: bool = False,
                       later: tuple[str, ...] = ()) -> WarmChild:
    """The evaluate child of run_candidate, started now (in a scratch directory of its own under
    scratch_root): its torch import and CUDA context overlap the candidate's build. Pass it to
    run_candidate, and close() it if the candidate never gets there. `sanitize_early` (a confirmation on a GPU):
    it starts compute-sanitizer's hosts at once too (tools/judge/sanitize.py start_hosts), but for the checks its job
    leaves for after the keep (`later`: racecheck's host, unused, would sit on the card beside the one that runs it)."""
    early = ",".join(c for c in SANITIZERS if c not in later) if sanitize_early else ""
    args = ["evaluate", "--task", str(task.root), "--job-stdin"] + ([f"--sanitize-early={early}"] if early else [])
    return WarmChild(task, prestart_python("tools.judge.judge", args, scratch_root, env=judge_env()))


class WarmChild:
    """A pre-started judge child (an evaluate child, or the checks after a keep: tools/judge/later.py) and what it
    loaded: it serves a task whose files are unchanged."""

    def __init__(self, task: Task, proc: Prestarted):
        self.root, self.stamp, self.proc = Path(task.root), _task_stamp(task), proc
        self.idle = False     # what the agent last said of its card (agent/evaluation/spares.py idle)

    def serves(self, task: Task) -> bool:
        return (self.proc.alive and not self.proc.used and self.root == Path(task.root)
                and self.stamp == _task_stamp(task))

    def close(self) -> None:
        self.proc.close()


def _task_stamp(task: Task) -> tuple:
    """What the child loaded before its job: the task's spec and its Python files."""
    out = []
    for p in sorted(Path(task.root).glob("*.py")) + [Path(task.root) / "task.toml"]:
        try:
            st = p.stat()
            out.append((p.name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((p.name, None, None))
    return tuple(out)


def run_candidate(task: Task, lib_path: Path, baseline_lib: Path | None, *, seed: int | None = None,
                  shapes: list[dict] | None = None, launch_context: dict | None = None,
                  warm: WarmChild | None = None, with_reference: bool = False,
                  scratch_root: Path | None = None, parity_extent: str = "full",
                  memcheck: bool = False, budgets: dict[str, StageBudget] | None = None,
                  keep_gain: float | None = None, rounds: int | None = None,
                  probes_done: tuple[str, ...] = (), later: tuple[str, ...] = ()) -> CandidateChecks:
    """The loop's candidate check in ONE child process: with `launch_context` ({limits, kernels,
    parent}: see tools.measure.launch.from_plan) the static launch check of the library's own plan, and
    nothing runs if it fails; then parity; then, only if it passed, the bench against the baseline.
    The same checks as tools.measure.launch.static_check + run_parity + run_bench, two torch starts and two
    CUDA contexts fewer per iteration. A crash or timeout is charged to the stage the child had
    entered (it says so on stderr). `warm` (prestart_candidate) is used if it still serves this
    task's files, else a child is started here; either way it is spent. `memcheck`: on a GPU, after parity,
    the candidate under compute-sanitizer memcheck and racecheck (tools/judge/sanitize.py) before the bench. `budgets`: each
    stage's seconds measured at the run's setup (tools/judge/budgets.py); the task's timeouts still bound the whole.
    `keep_gain`: the loop's minimum gain: the probes only a keep needs are left out below it (tools/measure/bench.py).
    `rounds`: the bench's rounds instead of task.toml's (the confirmation's, sized to the first bench's noise).
    `probes_done`: the probes an earlier bench of this library ran clean (the confirmation's: its first bench's); those
    that look at the library alone (tools/measure/probes.py BEFORE_KEEP) are not run again, and the message says so.
    `later`: with `memcheck`, the sanitizers left for after the keep (tools/judge/later.py); those that apply to the
    candidate come back in its ParityResult.later."""
    # no seed: the child draws its own (the one it drew when it started, tools/measure/warmup.py search_ahead)
    shapes = [dict(s) for s in (shapes or [task.spec.main])]
    job = {"lib": str(Path(lib_path).resolve()), "seed": seed, "shapes": shapes, "launch_context": launch_context,
           "baseline_lib": str(Path(baseline_lib).resolve()) if baseline_lib is not None else None,
           "no_reference": not with_reference, "parity_extent": parity_extent, "memcheck": memcheck,
           "allow_unchecked": allowed_unchecked(),
           "keep_gain": keep_gain, "rounds": rounds, "probes_done": list(probes_done), "later": list(later)}
    timeout = task.spec.parity.timeout_s + task.spec.bench.timeout_for(rounds)
    if memcheck and task.backend.gpu:
        from tools.judge.sanitize import TIMEOUT_S
        timeout += 2 * TIMEOUT_S     # memcheck, then racecheck where the kernel uses shared memory
    t0 = time.monotonic()
    if warm is None or not warm.serves(task):
        if warm is not None:
            warm.close()
        warm = prestart_candidate(task, scratch_root)   # started cold: the same child, given its job at once
    clock = StageClock(budgets) if budgets else None
    proc = warm.proc.run(json.dumps(job), timeout, clock)
    overrun = clock.overrun() if clock is not None and proc.status == ProcStatus.timeout else None
    data = child_json(proc.stdout)     # what the host left in its scratch directory goes to the record
    dt = time.monotonic() - t0
    if proc.status == ProcStatus.ok and data is not None:
        try:
            launch = None if data.get("launch") is None else LaunchResult.model_validate(data["launch"])
            par = None if data["parity"] is None else ParityResult.model_validate(data["parity"])
            bench = None if data["bench"] is None else [BenchResult.model_validate(r) for r in data["bench"]["results"]]
            return CandidateChecks(launch, par, bench, proc.dropped_bytes)
        except (KeyError, TypeError, ValueError) as e:
            return CandidateChecks(None, ParityResult(status=ParityStatus.error, seconds=dt,
                                                      message=f"evaluate child answered malformed JSON: {e}"), None,
                                   proc.dropped_bytes)
    lines = proc.stderr.splitlines()
    marks = [ln[len(STAGE_MARK):].strip() for ln in lines if ln.startswith(STAGE_MARK)]
    proc = proc.model_copy(update={"stderr": "\n".join(ln for ln in lines if not ln.startswith(STAGE_MARK))})
    stage = marks[-1] if marks else "parity"
    # the stages before the one that died passed in this child; their details were never printed
    lost = "ok (its details were lost when the child died in a later stage)"
    launch_ok = (LaunchResult(status=LaunchStatus.ok, message=lost) if launch_context is not None else None)
    if stage == "launch":
        return CandidateChecks(LaunchResult(status=LaunchStatus.error, seconds=dt,
                                            message=child_failure("launch plan", proc, data)), None, None,
                               proc.dropped_bytes)
    if stage == "bench":
        return CandidateChecks(launch_ok, ParityResult(status=ParityStatus.ok, message=lost, seconds=dt),
                               failed_bench(proc, data, shapes, dt, overrun), proc.dropped_bytes)
    return CandidateChecks(launch_ok, ParityResult(status=child_status(proc.status), seconds=dt,
                                                   message=child_failure(stage, proc, data, overrun)), None,
                           proc.dropped_bytes)

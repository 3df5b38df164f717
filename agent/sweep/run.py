"""`agent sweep TASK`: every knob configuration the restrictions allow, through the loop's checks,
each timed against the initial configuration. It tells what the knobs can reach, the bar for the
heuristic proposer.

Fast, for hundreds of configurations:
1. every configuration's task copy is built, `jobs` at a time (each build is its own ninja
   process);
2. the static launch check (each library's own plan against ptxas' resources and the device's
   limits; no profiler trace), then parity and the interleaved bench against the initial, run in
   batches, one throwaway child per batch (tools/judge/batch.py): a crash or a hang costs one
   configuration, never the sweep, and a rejected launch runs nothing;
   With --screen K, a short timing of each configuration alone (no parity) first ranks the space,
   and only the K fastest get the full checks; the rest are recorded as screened_out;
3. only the reported best gets the expensive checks: the dynamic launch check (the profiler
   trace), a fresh-process parity with a new seed and a fresh-process bench against the initial.
   If one fails, that point is marked failed with the reason and the next best is tried.

out_dir/sweep.json is rewritten (atomically) after each batch: a Ctrl-C or a kill loses at most
the batch under way.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from agent.evaluation.ended import IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.evaluation.executor import Executor, Local
from agent.records.schema import StageTimes
from agent.sweep.batches import evaluate_built, screen_built
from agent.sweep.build import Built, build_configurations
from agent.sweep.points import SweepPoint, SweepResult, one_line, save_result
from tools.backends.device import task_limits
from tools.build.reuse import latest_builds
from tools.task import Task


SCREEN_BATCH_FACTOR = 4


Progress = Callable[[int, int, SweepPoint], None]


def sweep(task: Task, out_dir: Path, limit: int | None = None, seed: int = 0, progress: Progress | None = None,
          *, jobs: int | None = None, batch: int = 16, screen: int | None = None,
          log: Callable[[str], None] | None = None, executor: Executor | None = None) -> SweepResult:
    """Measure the knob space (or a random sample of `limit` configurations); see the module doc.

    progress(n, total, point) is called once per configuration as its point is recorded; log(line)
    gets the build progress and the verification of the best. `executor` evaluates the configurations (parity and
    the bench against the initial; agent/evaluation/executor.py): here by default, or on dask workers, a GPU each."""
    say = log or (lambda _: None)
    ex = executor or Local()
    if screen is not None and screen < 1:
        raise ValueError("screen must keep at least 1 configuration")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = max(1, jobs or os.cpu_count() or 1)
    space = task.spec.knob_space()
    initial = {k: v for k, v in task.read_knobs().items() if v is not None}
    space = [c for c in space if c != initial]
    if limit is not None and limit < len(space):
        space = random.Random(seed).sample(space, limit)
    limits = task_limits(task)
    res = SweepResult(task=task.name, shape=task.spec.main, started=datetime.now().isoformat(timespec="seconds"),
                      initial_knobs=initial, total=len(space), jobs=jobs, batch=batch, screen=screen,
                      workers=ex.workers, where=ex.where)
    path = out_dir / "sweep.json"

    def record(point: SweepPoint) -> None:
        res.points.append(point)
        if progress:
            progress(len(res.points), len(space), point)

    try:
        init_ev = Evaluator(task, out_dir / "build-initial", limits)
        # the latest earlier builds of the task under the same runs folder (agent check's, runs')
        init_ev.reuse_objects = latest_builds(task, out_dir.parent)
        t = StageTimes()
        b = init_ev.build(t)
        base_lib = snapshot_lib(b.lib_path, out_dir / "initial" / f"lib{task.name}.so")

        t0 = time.monotonic()
        # the initial's parity (a child of its own, no timing) runs while the configurations compile; a failure
        # ends the builds at the next one done. Its bench waits for the builds: a timing on a quiet machine.
        with ThreadPoolExecutor(1, thread_name_prefix="sweep-initial") as pool:
            initial = pool.submit(init_ev.parity, base_lib, t)

            def abort() -> None:
                if initial.done():
                    initial.result()     # raises the initial's parity failure

            built = build_configurations(task, space, out_dir, limits, jobs, record, say, init_ev.reuse_objects, abort)
            initial.result()
        res.build_wall_s = time.monotonic() - t0
        res.initial_ms = init_ev.bench(base_lib, None, t)[0].timing("candidate").median_ms
        save_result(path, res)

        if screen is not None and len(built) > screen:
            t0 = time.monotonic()
            # a screen's timing is short (about 0.15 s), so a process's start-up (about 3 s) is shared by more
            built = screen_built(task, built, base_lib, screen, SCREEN_BATCH_FACTOR * batch, record, say)
            res.screen_wall_s = time.monotonic() - t0
            save_result(path, res)

        t0 = time.monotonic()

        def saved() -> None:
            res.eval_wall_s = time.monotonic() - t0
            save_result(path, res)

        evaluate_built(task, built, base_lib, batch, ex, record, saved, say)

        t0 = time.monotonic()
        _verify_best(res, {b.index: b for b in built}, base_lib, out_dir, limits, say)
        res.verify_wall_s = time.monotonic() - t0
        res.complete = True
    finally:
        save_result(path, res)
    return res


def _verify_best(res: SweepResult, built: dict[int, Built], base_lib: Path, out_dir: Path, limits,
                 say: Callable[[str], None]) -> SweepPoint | None:
    """The best by median goes through the pipeline every candidate of optimize goes through
    (Evaluator.evaluate_candidate: the static launch check, a fresh parity with a new seed, every shape and, on a
    GPU, memcheck and racecheck, and a fresh bench against the initial, in a fresh child), then the dynamic launch
    check; on a failure the point is marked and the next best is tried. Returns the verified point (also in res.verified)."""
    while (p := res.best()) is not None:
        b = built[p.index]   # type: ignore[index]
        ev = Evaluator(b.task, out_dir / f"cfg-{b.index}" / "build", limits)
        t = StageTimes()
        say(f"verifying the best, {p.knobs} at {p.median_ms * 1e3:.1f} us (launch check, fresh parity and bench)")
        try:
            # a GPU candidate about to be the answer goes under compute-sanitizer as a kept one of optimize does
            a = ev.evaluate_candidate(b.lib, base_lib, t, launch_context=b.launch_context, verify_launch=True,
                                      memcheck=b.task.backend.gpu)
            bench = a.bench
        except IterationEnded as e:
            p.ok, p.outcome, p.reason = False, e.outcome.value, "on verification: " + one_line(e.reason)
            say(f"{p.knobs} failed verification: {p.reason}")
            continue
        finally:
            p.seconds += t.launch + t.parity + t.bench
        ci = bench.speedup_vs_baseline
        p.verified = True
        p.verified_sanitizers = "; ".join(m.message for m in (a.parity.memcheck, a.parity.racecheck) if m is not None) \
            if a.parity is not None else ""
        if ci:
            p.verified_speedup, p.verified_ci_low, p.verified_ci_high = ci.median, ci.low, ci.high
        res.verified = p.knobs
        return p
    return None

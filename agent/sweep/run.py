"""`agent sweep TASK`: every knob configuration the restrictions allow, through the loop's checks,
each timed against the initial configuration. It tells what the knobs can reach, the bar for the
heuristic proposer.

Fast, for hundreds of configurations (issue 66: softmax's 199 in 108 s on an H200, BENCHMARKS.md):
1. every configuration's task copy is built, `jobs` at a time, each in a spawned process of its own (niced, with its
   compilers), while the initial's parity runs (a child of its own);
2. with --screen K, a short timing of each configuration alone (no parity, no probe) ranks the space, on a GPU beside
   the builds in chunks as they land (a CPU task's waits for them), and only the K fastest get the full checks; the
   rest are recorded as screened_out;
3. the static launch check (each library's own plan against ptxas' resources and the device's limits; no profiler
   trace), then parity and the interleaved bench against the initial, what a candidate of the loop pays (parity's
   quick extent, every probe but the reentrant one), in batches, one throwaway child per batch
   (tools/judge/batch.py): a crash or a hang costs one configuration, never the sweep, and a rejected launch runs
   nothing; each verdict is recorded as it lands, here or on a dask worker;
4. only the reported best gets what a keep pays: the dynamic launch check (the profiler trace), a fresh-process
   parity of every extent with a new seed, memcheck and racecheck, a fresh-process bench against the initial with
   every probe. If one fails, that point is marked failed with the reason and the next best is tried.

out_dir/sweep.json is rewritten (atomically) after each batch: a Ctrl-C or a kill loses at most
the batch under way.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from agent.evaluation.ended import IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.evaluation.executor import Executor, Local
from agent.records.schema import StageTimes
from agent.sweep.batches import as_built, evaluate_built, screen_built
from agent.sweep.build import Built, build_configurations
from agent.sweep.points import SweepPoint, SweepResult, one_line, save_result
from tools.backends.device import task_limits
from tools.build.reuse import latest_builds
from tools.task import Task


SCREEN_BATCH_FACTOR = 4
SCREEN_LEAST = 16      # configurations a screen child waits for while the builds go on (its start: about 1 s)


Progress = Callable[[int, int, SweepPoint], None]


def sweep(task: Task, out_dir: Path, limit: int | None = None, seed: int = 0, progress: Progress | None = None,
          *, jobs: int | None = None, batch: int = 16, screen: int | None = None,
          log: Callable[[str], None] | None = None, executor: Executor | None = None) -> SweepResult:
    """Measure the knob space (or a random sample of `limit` configurations); see the module doc.

    progress(n, total, point) is called once per configuration as its point is recorded; log(line)
    gets the build progress and the verification of the best. `executor` evaluates the configurations (parity and
    the bench against the initial; agent/evaluation/executor.py): here by default, or on dask workers, a GPU each."""
    lock = threading.RLock()     # the builds' failures and the screen's verdicts land on two threads

    def say(line: str) -> None:
        with lock:
            if log is not None:
                log(line)

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
        with lock:
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
        # Beside the builds (niced: agent/sweep/build.py): the initial's parity (a child of its own, no timing), then,
        # on a GPU, the screen of the configurations built so far, chunk by chunk; what either raises ends the builds
        # at the next one done. The initial's bench waits for both: a timing on a quiet machine.
        streamed = screen is not None and len(space) > screen
        beside = task.backend.gpu    # a CPU task's timing shares the cores with the builds however niced: it waits
        q: queue.Queue = queue.Queue()
        started: list[float] = []

        def chunks():
            for chunk in as_built(q, SCREEN_LEAST if beside else len(space), SCREEN_BATCH_FACTOR * batch,
                                  parity0.result):
                started[:] = started or [time.monotonic()]
                yield chunk

        with ThreadPoolExecutor(2, thread_name_prefix="sweep") as pool:
            parity0 = pool.submit(init_ev.parity, base_lib, t)
            screening = pool.submit(screen_built, task, chunks(), base_lib, screen, SCREEN_BATCH_FACTOR * batch,
                                    record, say, len(space), beside) if streamed else None

            def abort() -> None:
                for f in (parity0, screening):
                    if f is not None and f.done():
                        f.result()      # raises the initial's parity failure, or the screen's

            try:
                built = build_configurations(task, space, out_dir, limits, jobs, record, say, init_ev.reuse_objects,
                                             abort, q.put)
            finally:
                q.put(None)
            res.build_wall_s = time.monotonic() - t0
            parity0.result()
            if screening is not None:
                built = screening.result()
                res.screen_wall_s = time.monotonic() - (started[0] if started else t0)
        res.initial_ms = init_ev.bench(base_lib, None, t)[0].timing("candidate").median_ms
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

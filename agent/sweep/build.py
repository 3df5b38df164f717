"""A sweep's configurations built: each a copy of the task with its knobs written, built `jobs` at a time, its
library kept with the launch context the batch child checks it with (also `agent check --knobs`, knobcheck.py)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.evaluation.ended import IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.records.schema import StageTimes
from agent.sweep.points import SweepPoint, one_line
from tools.results import LaunchResult
from tools.task import Task, knob_pattern, load_task


BUILD_NICE = 10     # a nice-0 process gets about 9 times the CPU of a nice-10 one where both are runnable


def write_knobs(task_dir: Path, task: Task, cfg: dict[str, int]) -> None:
    for k in task.spec.knobs:
        p = task_dir / k.file
        text = p.read_text()
        text, n = knob_pattern(k.name).subn(lambda m: f"{m.group(1)}{cfg[k.name]}", text, count=1)
        if n != 1:
            raise ValueError(f"#define {k.name} not found in {p}")
        p.write_text(text)


@dataclass
class Built:
    """A configuration that compiled."""
    index: int
    knobs: dict[str, int]
    task: Task                 # its own task copy (the dynamic launch check reads its module)
    lib: Path
    launch_context: dict | None    # for the static launch check in the batch child (None: a CPU task)
    build_seconds: float
    seconds: float                 # so far: build, then the screen if any
    screen_ms: float | None = None
    launch: LaunchResult | None = None   # the static check's verdict, from the batch child



def build_configurations(task: Task, space: list[dict[str, int]], out_dir: Path, limits, jobs: int,
               record: Callable[[SweepPoint], None], say: Callable[[str], None],
               earlier: list[Path] | None = None, abort: Callable[[], None] = lambda: None,
               on_built: Callable[[Built], None] = lambda b: None) -> list[Built]:
    """Every configuration's copy built and statically checked, `jobs` at a time. Failures are recorded
    as points at once; the rest are handed to `on_built` as each is done (the screen, beside the builds) and come
    back in configuration order. `abort()` is called as each is done: what it raises ends the builds (those under
    way finish, the rest never start)."""
    built: list[Built] = []
    every = max(1, len(space) // 20)
    # processes, not threads: a build's own Python (the scan, reading its preprocessed sources, the ninja file, the
    # object cache) is 0.15-0.3 s a configuration, and 16 threads held to one interpreter lock took 20-25 s for 64
    # softmax configurations on a 16-core H200 host whose nvcc alone compiles them in 8. Spawned (fresh interpreters,
    # 0.3 s of imports each, at once), not forked from a process with threads; children of this process, so that the
    # pool's shutdown reaps them (a fork server's workers outlived the sweep as zombies where init does not reap).
    # Niced, with the compilers they start: what runs beside them on the GPU (the screen's timing, a parity) is
    # served first where both want a core.
    ex = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=os.nice,
                                initargs=(BUILD_NICE,))
    try:
        futs = [ex.submit(_prepare, task, n, cfg, out_dir, limits, earlier) for n, cfg in enumerate(space, 1)]
        for done, fut in enumerate(cf.as_completed(futs), 1):
            abort()
            r = fut.result()
            if isinstance(r, SweepPoint):
                record(r)
            else:
                built.append(r)
                on_built(r)
            if done % every == 0 or done == len(space):
                say(f"built {done}/{len(space)} ({done - len(built)} failed so far)")
    finally:   # a Ctrl-C: the builds under way finish (each is seconds), the queued ones never start
        ex.shutdown(wait=True, cancel_futures=True)
    return sorted(built, key=lambda b: b.index)


def _prepare(task: Task, n: int, cfg: dict[str, int], out_dir: Path, limits,
             earlier: list[Path] | None = None) -> Built | SweepPoint:
    """Copy the task, write the knobs, build; keep only the library (and ptxas' resources for the
    static launch check in the batch child)."""
    t0 = time.monotonic()
    work = out_dir / f"cfg-{n}"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(task.root, work / "task", ignore=shutil.ignore_patterns("__pycache__"))
    write_knobs(work / "task", task, cfg)
    ct = load_task(work / "task")
    ev = Evaluator(ct, work / "build", limits)
    # the initial build's binding, say: compiled once per sweep, or not at all where the initial build
    # linked an earlier one (`earlier`, tried after it)
    ev.reuse_objects = [out_dir / "build-initial", *(earlier or [])]
    t = StageTimes()
    try:
        b = ev.build(t)
        lib = snapshot_lib(b.lib_path, work / f"lib{task.name}.so")
        dt = time.monotonic() - t0
        return Built(index=n, knobs=cfg, task=ct, lib=lib, launch_context=ev.launch_context(b, None),
                      build_seconds=dt, seconds=dt)
    except IterationEnded as e:
        dt = time.monotonic() - t0
        return SweepPoint(knobs=cfg, index=n, ok=False, outcome=e.outcome.value, reason=one_line(e.reason),
                          build_seconds=dt, seconds=dt)
    finally:
        shutil.rmtree(work / "build", ignore_errors=True)   # objects: a CUDA build is about 1 MB each

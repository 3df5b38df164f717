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

import concurrent.futures as cf
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

from pydantic import BaseModel

from agent.evaluate import Evaluator, IterationEnded, snapshot_lib
from agent.executor import Executor, Local, pack_folder, unpack_folder
from agent.runlog import StageTimes
from tools.judge import batch as batch_eval
from tools.backends.device import task_limits
from tools.results import BatchItemResult, BatchStatus, LaunchResult
from tools.build.reuse import latest_builds
from tools.task import Task, knob_pattern, load_task, shape_label


SCREEN_BATCH_FACTOR = 4


class SweepPoint(BaseModel):
    knobs: dict[str, int]
    ok: bool
    # ok | compile_failed | launch_rejected | parity_failed | bench_failed | crashed | timeout | screened_out | lost
    outcome: str
    reason: str = ""
    index: int | None = None          # the configuration's number: its files are in out_dir/cfg-INDEX
    median_ms: float | None = None
    speedup_vs_initial: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    seconds: float = 0.0              # build + evaluation
    build_seconds: float = 0.0        # copy, build, static launch check
    eval_seconds: float = 0.0         # parity + bench in the batch child (+ the screen's timing)
    screen_ms: float | None = None    # --screen: the short timing alone that ranked it
    verified: bool = False            # passed the best's checks (dynamic launch, fresh parity and bench)
    verified_speedup: float | None = None   # from the fresh bench against the initial
    verified_ci_low: float | None = None
    verified_ci_high: float | None = None
    verified_sanitizers: str = ""     # on a GPU: what memcheck and racecheck said of the verified point
    worker: str = ""                  # --workers / --scheduler: the worker and GPU (or cores) that evaluated it


class SweepResult(BaseModel):
    task: str
    shape: dict
    started: str
    initial_knobs: dict[str, int]
    initial_ms: float | None = None
    points: list[SweepPoint] = []
    total: int | None = None          # configurations in this sweep (the initial not counted)
    jobs: int | None = None
    batch: int | None = None
    screen: int | None = None         # --screen K: only the K fastest by a short timing got the full checks
    verified: dict[str, int] | None = None   # knobs of the point that passed the best's checks
    complete: bool = False            # False: interrupted (or still running); the points so far are kept
    build_wall_s: float = 0.0
    screen_wall_s: float = 0.0
    eval_wall_s: float = 0.0
    verify_wall_s: float = 0.0
    workers: int = 1                  # evaluated on this many workers (agent/executor.py)
    where: str = ""                   # what evaluated: this process, or the dask workers

    def best(self) -> SweepPoint | None:
        """The fastest that passed: by its median, or on several workers (several GPUs: medians of different cards) by
        its speedup over the initial configuration, timed interleaved with it on the same worker."""
        ok = [p for p in self.points if p.ok and p.median_ms is not None]
        if self.workers > 1 and ok and all(p.speedup_vs_initial for p in ok):
            return max(ok, key=lambda p: p.speedup_vs_initial)
        return min(ok, key=lambda p: p.median_ms) if ok else None


def write_knobs(task_dir: Path, task: Task, cfg: dict[str, int]) -> None:
    for k in task.spec.knobs:
        p = task_dir / k.file
        text = p.read_text()
        text, n = knob_pattern(k.name).subn(lambda m: f"{m.group(1)}{cfg[k.name]}", text, count=1)
        if n != 1:
            raise ValueError(f"#define {k.name} not found in {p}")
        p.write_text(text)


@dataclass
class _Built:
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


Progress = Callable[[int, int, SweepPoint], None]


def sweep(task: Task, out_dir: Path, limit: int | None = None, seed: int = 0, progress: Progress | None = None,
          *, jobs: int | None = None, batch: int = 16, screen: int | None = None,
          log: Callable[[str], None] | None = None, executor: Executor | None = None) -> SweepResult:
    """Measure the knob space (or a random sample of `limit` configurations); see the module doc.

    progress(n, total, point) is called once per configuration as its point is recorded; log(line)
    gets the build progress and the verification of the best. `executor` evaluates the configurations (parity and
    the bench against the initial; agent/executor.py): here by default, or on dask workers, a GPU each."""
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
        init_ev.parity(base_lib, t)
        res.initial_ms = init_ev.bench(base_lib, None, t)[0].timing("candidate").median_ms
        _save(path, res)

        t0 = time.monotonic()
        built = build_configurations(task, space, out_dir, limits, jobs, record, say, init_ev.reuse_objects)
        res.build_wall_s = time.monotonic() - t0
        _save(path, res)

        if screen is not None and len(built) > screen:
            t0 = time.monotonic()
            # a screen's timing is short (about 0.15 s), so a process's start-up (about 3 s) is shared by more
            built = _screen(task, built, base_lib, screen, SCREEN_BATCH_FACTOR * batch, record, say)
            res.screen_wall_s = time.monotonic() - t0
            _save(path, res)

        t0 = time.monotonic()

        def saved() -> None:
            res.eval_wall_s = time.monotonic() - t0
            _save(path, res)

        evaluate_built(task, built, base_lib, batch, ex, record, saved, say)

        t0 = time.monotonic()
        _verify_best(res, {b.index: b for b in built}, base_lib, out_dir, limits, say)
        res.verify_wall_s = time.monotonic() - t0
        res.complete = True
    finally:
        _save(path, res)
    return res


@dataclass(frozen=True)
class Chunk:
    """Configurations evaluated together on one worker: their libraries (paths here; for a dask worker their bytes, so
    that a worker on another host needs none of this host's files), launch contexts and numbers in `built`."""
    libs: list[str]
    contexts: list[dict | None]
    indices: list[int]
    data: list[bytes] | None = None


@dataclass(frozen=True)
class Shipped:
    """What every chunk sent to a dask worker needs besides its libraries: the task's folder and the initial library."""
    task: bytes
    baseline: bytes
    name: str                 # the libraries' file name


def evaluate_chunk(task_root: str, baseline: str, batch: int, chunk: Chunk,
                   shipped: Shipped | None = None) -> list[tuple[int, BatchItemResult]]:
    """What a worker runs (or this process, with the local executor): parity and the bench against the initial of each
    library of the chunk, `batch` per throwaway child (tools/judge/batch.py). With `shipped`, from the bytes it carries,
    unpacked in a folder of the worker's own that is removed after."""
    if shipped is None:
        return _evaluate_chunk(Path(task_root), Path(baseline), [Path(p) for p in chunk.libs], batch, chunk)
    with tempfile.TemporaryDirectory(prefix="agent-chunk-") as tmp:
        root = unpack_folder(shipped.task, Path(tmp) / "task")
        (Path(tmp) / "initial").mkdir()
        base = Path(tmp) / "initial" / shipped.name
        base.write_bytes(shipped.baseline)
        libs = []
        for k, data in enumerate(chunk.data or []):
            (Path(tmp) / f"cfg-{k}").mkdir()
            libs.append(Path(tmp) / f"cfg-{k}" / shipped.name)
            libs[-1].write_bytes(data)
        return _evaluate_chunk(root, base, libs, batch, chunk)


def _evaluate_chunk(root: Path, baseline: Path, libs: list[Path], batch: int,
                    chunk: Chunk) -> list[tuple[int, BatchItemResult]]:
    task = load_task(root)
    out: list[tuple[int, BatchItemResult]] = []
    for settled in batch_eval.evaluate(task, libs, baseline, batch=batch, contexts=chunk.contexts):
        out += [(chunk.indices[k], r) for k, r in settled]
    return out


def evaluate_built(task: Task, built: list[_Built], base_lib: Path, batch: int, ex: Executor,
                   record: Callable[[SweepPoint], None], saved: Callable[[], None],
                   say: Callable[[str], None] = lambda _: None) -> None:
    """Every built configuration through parity and the bench, in chunks: `batch` each here; on several workers an
    equal share each (at most `batch`), so that the workers finish together. A chunk whose worker died twice is
    recorded as lost, configuration by configuration."""
    local = isinstance(ex, Local)
    size = batch if local else max(1, min(batch, math.ceil(len(built) / ex.workers)))
    chunks = [Chunk(libs=[str(b.lib) for b in built[i:i + size]], contexts=[b.launch_context for b in built[i:i + size]],
                    indices=list(range(i, min(i + size, len(built)))),
                    data=None if local else [b.lib.read_bytes() for b in built[i:i + size]])
              for i in range(0, len(built), size)]
    shipped = None if local else Shipped(task=pack_folder(task.root), baseline=base_lib.read_bytes(), name=base_lib.name)
    fn = partial(evaluate_chunk, str(task.root), str(base_lib), batch, shipped=shipped)
    if built:
        say(f"evaluating {len(built)} configurations in {len(chunks)} chunk(s) of up to {size} on {ex.where} "
            "(parity, then the bench against the initial; a chunk reports when its batch child is done)")
    def started(n: int, worker: str) -> None:
        if not local:
            say(f"chunk {n + 1}/{len(chunks)} ({len(chunks[n].indices)} configurations) started on {worker}")
    for done in ex.run(fn, chunks, started=started):
        if done.error is not None:
            raise done.error
        if done.lost:
            for k in chunks[done.index].indices:
                b = built[k]
                record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome="lost", reason=done.lost,
                                  build_seconds=b.build_seconds, seconds=b.seconds, worker=done.worker))
            saved()
            continue
        for k, r in done.value:
            built[k].launch = r.launch or built[k].launch
            p = _point(built[k], r)
            p.worker = "" if ex.workers <= 1 and done.worker == "local" else done.worker
            record(p)
            if r.status != BatchStatus.ok:
                built[k].lib.unlink(missing_ok=True)   # only the passing ones are kept for a second look
        saved()


def build_configurations(task: Task, space: list[dict[str, int]], out_dir: Path, limits, jobs: int,
               record: Callable[[SweepPoint], None], say: Callable[[str], None],
               earlier: list[Path] | None = None) -> list[_Built]:
    """Every configuration's copy built and statically checked, `jobs` at a time. Failures are recorded
    as points at once; the rest come back in configuration order."""
    built: list[_Built] = []
    every = max(1, len(space) // 20)
    ex = cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sweep-build")
    try:
        futs = [ex.submit(_prepare, task, n, cfg, out_dir, limits, earlier) for n, cfg in enumerate(space, 1)]
        for done, fut in enumerate(cf.as_completed(futs), 1):
            r = fut.result()
            if isinstance(r, SweepPoint):
                record(r)
            else:
                built.append(r)
            if done % every == 0 or done == len(space):
                say(f"built {done}/{len(space)} ({done - len(built)} failed so far)")
    finally:   # a Ctrl-C: the builds under way finish (each is seconds), the queued ones never start
        ex.shutdown(wait=True, cancel_futures=True)
    return sorted(built, key=lambda b: b.index)


def _prepare(task: Task, n: int, cfg: dict[str, int], out_dir: Path, limits,
             earlier: list[Path] | None = None) -> _Built | SweepPoint:
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
        return _Built(index=n, knobs=cfg, task=ct, lib=lib, launch_context=ev.launch_context(b, None),
                      build_seconds=dt, seconds=dt)
    except IterationEnded as e:
        dt = time.monotonic() - t0
        return SweepPoint(knobs=cfg, index=n, ok=False, outcome=e.outcome.value, reason=_line(e.reason),
                          build_seconds=dt, seconds=dt)
    finally:
        shutil.rmtree(work / "build", ignore_errors=True)   # objects: a CUDA build is about 1 MB each


def _screen(task: Task, built: list[_Built], base_lib: Path, keep: int, batch: int,
            record: Callable[[SweepPoint], None], say: Callable[[str], None]) -> list[_Built]:
    """A short timing of each alone; returns the `keep` fastest. A configuration that fails the screen
    (crash, hang, wrong in the bench's spot checks) is recorded with that outcome; the others that
    are not kept, as screened_out."""
    say(f"screening {len(built)} configurations by a short timing; the {keep} fastest get the full checks")
    timed: list[_Built] = []
    for settled in batch_eval.evaluate(task, [c.lib for c in built], base_lib, batch=batch, screen=True,
                                       contexts=[c.launch_context for c in built]):
        for k, r in settled:
            b = built[k]
            b.seconds += r.seconds
            b.launch = r.launch or b.launch
            cand = r.bench.timing("candidate") if r.bench is not None else None
            if r.status == BatchStatus.ok and cand is not None:
                b.screen_ms = cand.median_ms
                timed.append(b)
            else:
                b.lib.unlink(missing_ok=True)
                record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome=r.status.value,
                                  reason="on the screen: " + _line(r.message), build_seconds=b.build_seconds,
                                  eval_seconds=r.seconds, seconds=b.seconds))
    timed.sort(key=lambda b: b.screen_ms)
    for b in timed[keep:]:
        b.lib.unlink(missing_ok=True)
        record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome="screened_out", screen_ms=b.screen_ms,
                          reason=f"screen: {b.screen_ms * 1e3:.1f} us alone, not among the {keep} fastest "
                                 f"(the slowest kept: {timed[keep - 1].screen_ms * 1e3:.1f} us)",
                          build_seconds=b.build_seconds, eval_seconds=b.seconds - b.build_seconds, seconds=b.seconds))
    return sorted(timed[:keep], key=lambda b: b.index)


def _point(b: _Built, r: BatchItemResult) -> SweepPoint:
    p = SweepPoint(knobs=b.knobs, index=b.index, ok=r.status == BatchStatus.ok, outcome=r.status.value,
                   reason="" if r.status == BatchStatus.ok else _line(r.message), screen_ms=b.screen_ms,
                   build_seconds=b.build_seconds, eval_seconds=b.seconds - b.build_seconds + r.seconds,
                   seconds=b.seconds + r.seconds)
    if r.bench is not None and r.status == BatchStatus.ok:
        cand = r.bench.timing("candidate")
        p.median_ms = cand.median_ms if cand else None
        p.ok = p.median_ms is not None
        ci = r.bench.speedup_vs_baseline
        if ci:
            p.speedup_vs_initial, p.ci_low, p.ci_high = ci.median, ci.low, ci.high
    return p


def _verify_best(res: SweepResult, built: dict[int, _Built], base_lib: Path, out_dir: Path, limits,
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
            p.ok, p.outcome, p.reason = False, e.outcome.value, "on verification: " + _line(e.reason)
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


def _save(path: Path, res: SweepResult) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(res.model_dump_json(indent=2))
    os.replace(tmp, path)


def _line(reason: str) -> str:
    lines = [ln for ln in (reason or "").splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def describe(res: SweepResult) -> str:
    b = res.best()
    n = len(res.points)
    counts: dict[str, int] = {}
    for p in res.points:
        counts[p.outcome] = counts.get(p.outcome, 0) + 1
    tally = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    head = f"sweep of {res.task}" + ("" if res.complete else " (interrupted)")
    if b is None:
        return f"{head}: no configuration passed ({n} configurations: {tally})"
    check = (f"verified: {b.verified_speedup:.2f}x in a fresh bench" if b.verified and b.verified_speedup
             else "verified" if b.verified else "not verified")
    vs = f"{b.speedup_vs_initial:.2f}x" if b.speedup_vs_initial is not None else "?"
    return (f"{head} on {shape_label(res.shape)}: best {b.knobs} at {b.median_ms * 1e3:.1f} us, "
            f"{vs} vs the initial configuration ({check}); {n} configurations: {tally}")

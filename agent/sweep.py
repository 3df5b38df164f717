"""`agent sweep TASK`: every knob configuration the restrictions allow, through the same build,
launch check, parity and bench as the loop, each timed against the initial configuration.
It tells what the knobs can reach, the bar for the heuristic proposer."""

from __future__ import annotations

import random
import shutil
import time
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel

from agent.evaluate import Evaluator, IterationEnded, snapshot_lib
from agent.runlog import StageTimes
from tools.task import Task, knob_pattern, load_task, shape_label


class SweepPoint(BaseModel):
    knobs: dict[str, int]
    ok: bool
    outcome: str                      # ok | compile_failed | launch_rejected | parity_failed | bench_failed
    reason: str = ""
    median_ms: float | None = None
    speedup_vs_initial: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    seconds: float = 0.0


class SweepResult(BaseModel):
    task: str
    shape: dict
    started: str
    initial_knobs: dict[str, int]
    initial_ms: float | None = None
    points: list[SweepPoint] = []

    def best(self) -> SweepPoint | None:
        ok = [p for p in self.points if p.ok and p.median_ms is not None]
        return min(ok, key=lambda p: p.median_ms) if ok else None


def write_knobs(task_dir: Path, task: Task, cfg: dict[str, int]) -> None:
    for k in task.spec.knobs:
        p = task_dir / k.file
        text = p.read_text()
        text, n = knob_pattern(k.name).subn(lambda m: f"{m.group(1)}{cfg[k.name]}", text, count=1)
        if n != 1:
            raise ValueError(f"#define {k.name} not found in {p}")
        p.write_text(text)


def sweep(task: Task, out_dir: Path, limit: int | None = None, seed: int = 0, progress=None) -> SweepResult:
    from agent.loop import _device_limits
    out_dir.mkdir(parents=True, exist_ok=True)
    space = task.spec.knob_space()
    initial = {k: v for k, v in task.read_knobs().items() if v is not None}
    space = [c for c in space if c != initial]
    if limit is not None and limit < len(space):
        space = random.Random(seed).sample(space, limit)
    limits = _device_limits(task)
    res = SweepResult(task=task.name, shape=task.spec.main, started=datetime.now().isoformat(timespec="seconds"),
                      initial_knobs=initial)
    init_ev = Evaluator(task, out_dir / "build-initial", limits)
    t = StageTimes()
    b = init_ev.build(t)
    base_lib = snapshot_lib(b.lib_path, out_dir / "initial" / f"lib{task.name}.so")
    init_ev.parity(base_lib, t)
    res.initial_ms = init_ev.bench(base_lib, None, t)[0].timing("candidate").median_ms
    for n, cfg in enumerate(space, 1):
        t0 = time.monotonic()
        work = out_dir / f"cfg-{n}"
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(task.root, work / "task", ignore=shutil.ignore_patterns("__pycache__"))
        write_knobs(work / "task", task, cfg)
        ct = load_task(work / "task")
        ev = Evaluator(ct, work / "build", limits)
        point = SweepPoint(knobs=cfg, ok=False, outcome="ok")
        try:
            bb = ev.build(t)
            ev.launch(bb, None, t)
            lib = Path(bb.lib_path)
            ev.parity(lib, t)
            bench = ev.bench(lib, base_lib, t)[0]
            ci = bench.speedup_vs_baseline
            point.ok, point.median_ms = True, bench.timing("candidate").median_ms
            if ci:
                point.speedup_vs_initial, point.ci_low, point.ci_high = ci.median, ci.low, ci.high
        except IterationEnded as e:
            point.outcome, point.reason = e.outcome.value, e.reason.splitlines()[0][:200]
        point.seconds = time.monotonic() - t0
        res.points.append(point)
        (out_dir / "sweep.json").write_text(res.model_dump_json(indent=2))
        shutil.rmtree(work / "build", ignore_errors=True)
        if progress:
            progress(n, len(space), point)
    return res


def describe(res: SweepResult) -> str:
    b = res.best()
    if b is None:
        return f"sweep of {res.task}: no configuration passed"
    return (f"sweep of {res.task} on {shape_label(res.shape)}: best {b.knobs} at {b.median_ms * 1e3:.1f} us, "
            f"{b.speedup_vs_initial:.2f}x vs the initial configuration ({len(res.points)} configurations)")

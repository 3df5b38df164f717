"""out_dir/sweep.json: each configuration's point (SweepPoint), the sweep's record (SweepResult, its best()),
written atomically (save_result), and its one-line summary (describe)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from tools.task import shape_label


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
    build_wall_s: float = 0.0         # the builds (the initial's parity and the screen beside them)
    screen_wall_s: float = 0.0        # from the screen's first chunk to its end (issue 66: beside the builds)
    eval_wall_s: float = 0.0
    verify_wall_s: float = 0.0
    workers: int = 1                  # evaluated on this many workers (agent/evaluation/executor.py)
    where: str = ""                   # what evaluated: this process, or the dask workers

    def best(self) -> SweepPoint | None:
        """The fastest that passed: by its median, or on several workers (several GPUs: medians of different cards) by
        its speedup over the initial configuration, timed interleaved with it on the same worker."""
        ok = [p for p in self.points if p.ok and p.median_ms is not None]
        if self.workers > 1 and ok and all(p.speedup_vs_initial for p in ok):
            return max(ok, key=lambda p: p.speedup_vs_initial)
        return min(ok, key=lambda p: p.median_ms) if ok else None


def save_result(path: Path, res: SweepResult) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(res.model_dump_json(indent=2))
    os.replace(tmp, path)


def one_line(reason: str) -> str:
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

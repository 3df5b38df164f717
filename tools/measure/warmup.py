"""Parity's own GPU work paid before the job (issue 66): a judge child started ahead of its candidate (the loop's
prestarted evaluate child, the evaluator's held confirmation child: tools/judge/candidate.py) runs the checks once on
the task's smallest listed shape with the task's reference standing in for the kernel, while it waits for its job.

Why: a fresh process pays for the first use of each torch kernel it launches (CUDA's lazy module loading, cuBLAS and
cuDNN handles), and parity launches many (the reference's, the draws', the comparisons'). On an H200 a fresh judge's
confirmation parity on attention_fwd took 8.33 s and the same checks on other seeds in the same process 5.81 and
5.91 s: SDPA's first calls were 2.0 s of the 8.33 s, 0.16 s once warm (softmax: 3.06 s, then 1.98 s; BENCHMARKS.md).
Nothing of the candidate runs here, and nothing here reaches a verdict: the stand-in's checks are thrown away; the job's
checks are the same code on their own seeds and shapes. The warm-up stops as soon as the job is waiting on stdin (a
child started cold is given its job at once and pays nothing) or its time is up.
"""

from __future__ import annotations

import math
import select
import sys
import time

SECONDS = 8.0    # at most this long, between two checks


def job_waiting(stream=None) -> bool:
    """Whether the job has already come on `stream` (default stdin); False where it cannot be told."""
    try:
        return bool(select.select([stream or sys.stdin], [], [], 0)[0])
    except (OSError, ValueError, TypeError):
        return False


def stand_in(mod):
    """The task's `run` with its reference in the kernel's place: the reference's values written into the output."""
    import torch

    def run(lib, shape, out, *inputs):
        exp = mod.reference(shape, *inputs)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        exps = [exp] if isinstance(exp, torch.Tensor) else list(exp)
        for o, e in zip(outs, exps):
            o.copy_(e)
    return run


def warm_checks(task, mod, extent: str, seconds: float = SECONDS, waiting=job_waiting) -> str:
    """Parity's checks (tools/measure/parity.py) once per distribution on the smallest listed shape, the stand-in as
    the kernel; with extent "rest" or "full" also the value draws and the views off alignment that a confirmation
    runs. Returns one line: how many checks in how many seconds, and why it stopped early where it did. Never raises:
    a task whose checks cannot run here says so in its job."""
    from tools.measure.buffers import Buffers
    from tools.measure.domains import draws
    from tools.measure.parity import one_check
    from tools.measure.views import Offsets, draws as offset_draws, is_offset
    t0 = time.monotonic()
    spec, backend = task.spec, task.backend
    if not spec.shapes:
        return "warm-up: no listed shape"
    shape = dict(min(spec.shapes, key=lambda s: math.prod(v for v in s.values() if isinstance(v, int) and v > 0)))
    dists = list(spec.distributions) + (draws(spec) + offset_draws() if extent in ("rest", "full") else [])
    run, done, why = stand_in(mod), 0, ""
    import torch
    try:
        for dist in dists:
            if waiting():
                why = "; stopped: the job came"
                break
            if time.monotonic() - t0 > seconds:
                why = f"; stopped: past {seconds:g} s"
                break
            bufs = Buffers(torch)
            bufs.misalign = Offsets(spec, dist, 1, mod) if is_offset(dist) else None
            one_check(task, mod, None, shape, "warm-up", dist, 1, backend.torch_device, bufs, backend.sync, run, run)
            done += 1
    except Exception as e:   # the task's own code on its own shape: the job's checks will say what is wrong
        why = f"; stopped: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    finally:
        if backend.gpu:
            torch.cuda.empty_cache()
    return f"warm-up: {done} of parity's checks on {shape} in {time.monotonic() - t0:.2f} s{why}"

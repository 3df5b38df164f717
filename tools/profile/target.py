"""The profiled program: `python -m tools.profile.target --task DIR --lib PATH --shape-index I
--warmup W --iters N [--trace OUT.json] [--nvtx RANGE]`.

Loads the task module and the compiled library, makes inputs for one shape and calls task.run
W + N times; ncu wraps this process (launch skip past the warm-up). With --trace, the N measured
calls run under the torch profiler and its chrome trace is written (the no-counter fallback).
Prints one JSON line last.

Without --lib the program starts up (torch imported, under ncu where ncu wraps it) and then waits for its job, one
JSON line on stdin: {"lib": PATH}. Those start-up seconds were 2.3-2.8 of a keep's 5-7 s Nsight Compute pass on an
H200 (BENCHMARKS.md, issue 66), and a pass started early (tools/profile/warm.py) pays them while the agent does other
work. A CUDA task's context is made only when a line {"prepare": true} comes before the job: a program waiting under
ncu with its context made slowed the two-thread calls of every bench beside it threefold on an H200 (the reentrant
probe 1.45 s beside it, 0.45-0.62 s alone), and without its context it does not (0.47-0.50 s; BENCHMARKS.md, issue
66 slice 9). The task (task.toml, its Python) is read again once the job has come: a candidate's commit may have
changed it since the start.

The target loads a candidate's library (and its task's Python, which a candidate's commit may change) with ncu's
injection in its process: it runs as the judge's host does, in a scratch directory of its own with the Landlock fence
(tools/isolation/confine.py) put on itself before it imports anything of the task's, so that it writes nowhere else
(not the user's checkout, not the judge's shared JIT cache, tools/backends/jitcache.py). Its parents start it with
target_env(): HOME, TMPDIR and the caches in the scratch directory; under ncu, HOME and TMPDIR left the agent's (its
section files, the lock that serializes every pass on the machine, which the fence lets the target take), and the
target takes its scratch directory for HOME and Python's temporary files once running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the target itself loads the task at run time; the type is for the argv builder
    from tools.task import Task


def target_argv(task: Task, lib_path: str | Path | None, shape: int | dict | None, warmup: int, iters: int,
                trace: str | None = None, nvtx: str | None = None) -> list[str]:
    """How to start this program on one shape of a task (ncu wraps it; the fallback traces it). `nvtx`: the measured
    calls inside an NVTX push/pop range of that name (ncu --nvtx-include NAME/: every launch they make, whatever
    its kernel's name and however many a call makes)."""
    argv = [sys.executable, "-m", "tools.profile.target", "--task", str(Path(task.root).resolve())]
    if lib_path is not None:      # without: the target waits for its library on stdin (module docstring)
        argv += ["--lib", str(Path(lib_path).resolve())]
    argv += ["--warmup", str(warmup), "--iters", str(iters)]
    if shape is not None:
        argv += ["--shape-index", str(shape_index(task, shape))]
    if trace:
        argv += ["--trace", trace]
    if nvtx:
        argv += ["--nvtx", nvtx]
    return argv


def target_env(scratch, ncu: bool = False) -> dict[str, str]:
    """The environment of the target in `scratch` (tools/isolation/scratch.py Scratch), alone or under ncu (`ncu`):
    python_env's, the scratch directory's HOME, TMPDIR, caches and AGENT_SCRATCH (the target fences itself to it:
    fence()). Under ncu, the agent's own HOME and TMPDIR: ncu copies its section files under HOME on a first run (56
    files in every pass's scratch directory otherwise, on an H200), and its injection in the target takes a lock in
    $TMPDIR/nvidia/nsight_compute (else /tmp's) that serializes the passes of every ncu on the machine. That folder is
    made here and named to the target (AGENT_NCU_LOCK), whose fence lets it write there and nowhere else outside its
    scratch directory."""
    from tools.isolation.sandbox import python_env
    env = python_env(None, scratch)
    if not ncu:
        return env
    env.pop("TMPDIR", None)
    env.pop("HOME", None)
    lock = os.path.join(os.environ.get("TMPDIR") or "/tmp", "nvidia", "nsight_compute")
    try:
        os.makedirs(lock, exist_ok=True)
        env["AGENT_NCU_LOCK"] = lock
    except OSError:
        pass       # the pass's injection then finds no lock folder it may write in, and ncu says so
    return env


def fence() -> bool:
    """This process confined to writing in its scratch directory ($AGENT_SCRATCH: target_env) and ncu's lock folder
    ($AGENT_NCU_LOCK), its HOME and Python's temporary folder moved into the scratch directory first (TMPDIR itself
    stays: ncu's injection finds its lock through it); whether a fence was put on (none without a scratch directory or
    without Landlock)."""
    scratch = os.environ.get("AGENT_SCRATCH")
    if scratch and os.path.isdir(os.path.join(scratch, "tmp")):
        tempfile.tempdir = os.path.join(scratch, "tmp")
        os.environ["HOME"] = scratch
    from tools.isolation.confine import fence_scratch
    lock = os.environ.get("AGENT_NCU_LOCK")
    return fence_scratch(also=(lock,) if lock else ())


def shape_index(task: Task, shape: int | dict) -> int:
    if isinstance(shape, int):
        if not 0 <= shape < len(task.spec.shapes):
            raise ValueError(f"shape index {shape} is outside the task's {len(task.spec.shapes)} shapes")
        return shape
    try:
        return task.spec.shapes.index(shape)
    except ValueError:
        raise ValueError(f"shape {shape} is not one of the task's shapes {task.spec.shapes}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.profile.target")
    ap.add_argument("--task", required=True)
    ap.add_argument("--lib", default=None, help="the library; without it, one JSON line on stdin names it")
    ap.add_argument("--shape-index", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--nvtx", default=None)
    a = ap.parse_args(argv)
    fence()      # before the task's Python and the candidate's library are loaded (module docstring)

    from tools.task import load_task
    from tools.task_messages import make_inputs

    if a.lib is None:      # torch now; the CUDA context when told to prepare (module docstring); the task read again
        __import__("torch")
        waiting = load_task(a.task)     # its module imported now; read again once the job has come
        while a.lib is None:
            line = sys.stdin.readline()
            if not line.strip():     # the agent ended the pass it started (or died): nothing to profile
                return 0
            job = json.loads(line)
            if not isinstance(job, dict):
                raise SystemExit(f"tools.profile.target: a job is a JSON object, not {line.strip()[:80]!r}")
            if job.get("prepare"):
                waiting.backend.warm_up()
            a.lib = job.get("lib")
    task = load_task(a.task)
    spec = task.spec
    shape = spec.shapes[spec.main_shape if a.shape_index is None else a.shape_index]
    mod = task.module()
    backend = task.backend
    lib = backend.load(a.lib)
    inputs = make_inputs(mod, shape, 0, backend.torch_device, spec.distributions[0])
    out = mod.empty_output(shape, *inputs)
    sync = backend.sync

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        mod.run(lib, shape, out, *inputs)
    sync()
    if a.trace:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend.gpu else [])
        with profile(activities=acts) as prof:
            for _ in range(a.iters):
                mod.run(lib, shape, out, *inputs)
            sync()
        prof.export_chrome_trace(a.trace)
    else:
        if a.nvtx and backend.gpu:
            import torch
            torch.cuda.nvtx.range_push(a.nvtx)
        for _ in range(a.iters):
            mod.run(lib, shape, out, *inputs)
        sync()
        if a.nvtx and backend.gpu:
            torch.cuda.nvtx.range_pop()
    print(json.dumps({"ok": True, "task": spec.name, "shape": shape, "calls": a.warmup + a.iters,
                      "seconds": round(time.perf_counter() - t0, 4), "trace": a.trace}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

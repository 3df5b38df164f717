"""The child-process entry: load a task module and a candidate library, run parity or bench work.

    python -m tools.runner parity --task DIR --lib PATH [--seed N] [--no-hidden]
    python -m tools.runner bench  --task DIR --lib PATH [--baseline-lib PATH] [--shapes JSON] [--no-reference]
    python -m tools.runner evaluate --task DIR --lib PATH --baseline-lib PATH [--seed N] [--launch-context JSON]
    python -m tools.runner evaluate --task DIR --job-stdin      (pre-started: the options come on stdin)

`evaluate` is the loop's candidate check in one child (one torch start and one CUDA context instead
of three): with --launch-context (device limits, ptxas resources, the parent's launch), the static
launch check of the library's own plan first, and nothing runs on the GPU if it fails; then parity;
then, if it passed, the bench against the best. It says on stderr which stage it enters, so the
parent can tell a crash in one stage from one in the next. With --job-stdin the child is started
early (while the candidate builds): it loads the task module, torch and the CUDA context, then waits
for its job on stdin, so the start-up leaves the iteration's critical path.

The parent (tools/parity.py, tools/bench.py, tools/candidate.py) runs this through tools.sandbox
(run_python_json, or prestart_python for a child started early), in a new session with a timeout; a segfault, a hang or a poisoned CUDA context dies with this
process. The last line on stdout is the one JSON result. Anything the kernel or the task prints
goes to stderr: fd 1 is pointed at stderr before any generated code loads, and the result is
written to a private copy of the original stdout, so a kernel's buffered printf flushed at exit
cannot land after (or pose as) the result.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

from tools.sandbox import STAGE_MARK


def private_stdout():
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")


def load_lib(path: str) -> ctypes.CDLL:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"library {path} does not exist")
    return ctypes.CDLL(str(p.resolve()), mode=os.RTLD_LOCAL | os.RTLD_NOW)




def _error_json(mode: str, msg: str, shapes: list[dict]) -> dict:
    if mode == "evaluate":
        return {"launch": None, "parity": {"status": "error", "message": msg}, "bench": None}
    if mode == "parity":
        return {"status": "error", "message": msg}
    return {"results": [{"status": "error", "message": msg, "shape": s} for s in shapes]}


def parity_then_bench(task, mod, lib, base, *, seed: int, shapes: list[dict], hidden: bool = True,
                      with_reference: bool = False, mark=lambda stage: None):
    """Parity, then (only if it passed) the bench against `base`, in this process: the candidate check
    shared by the loop's evaluate child and the sweep's batch child. Returns (ParityResult, the
    BenchResults or None); `mark(stage)` is called as each stage starts."""
    from tools.bench import measure
    from tools.parity import check
    from tools.results import ParityStatus
    mark("parity")
    par = check(task, mod, lib, seed=seed, hidden=hidden)
    if par.status != ParityStatus.ok:
        return par, None
    mark("bench")
    return par, measure(task, mod, lib, baseline=base, shapes=shapes, with_reference=with_reference)


def static_launch(task, mod, lib, ctx: dict) -> dict:
    """tools.launch's static check on the plan of the library loaded here (no second child)."""
    import time

    from tools._plan_child import plan_from
    from tools.launch import from_plan
    from tools.results import DeviceLimits, KernelResources, LaunchResult
    t0 = time.monotonic()
    try:
        data = plan_from(mod, lib, {k: (v if isinstance(v, bool) else int(v)) for k, v in task.spec.main.items()},
                         task.spec.module)
    except Exception as e:  # the task's launch_plan raised
        data = {"ok": False, "error": f"launch_plan raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    parent = LaunchResult.model_validate(ctx["parent"]) if ctx.get("parent") else None
    res = from_plan(task, data, [KernelResources.model_validate(k) for k in ctx.get("kernels", [])],
                    DeviceLimits.model_validate(ctx["limits"]), parent)
    res.seconds = time.monotonic() - t0
    return res.model_dump(mode="json")


def _warm_up(task) -> None:
    """What a job would pay first: torch and, for a CUDA task, the device's context."""
    import torch
    if task.spec.device == "cuda" and torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")


def _mark(stage: str) -> None:
    sys.stderr.write(f"\n{STAGE_MARK}{stage}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.runner")
    ap.add_argument("mode", choices=["parity", "bench", "evaluate"])
    ap.add_argument("--task", required=True)
    ap.add_argument("--lib")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hidden", action="store_true")
    ap.add_argument("--baseline-lib")
    ap.add_argument("--shapes", help="JSON list of shape dicts (bench; default the main shape)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--launch-context", help="evaluate: JSON {limits, kernels, parent} for the static launch check")
    ap.add_argument("--job-stdin", action="store_true",
                    help="start up first (task module, torch, the CUDA context), then read the job's options "
                         "(lib, baseline_lib, seed, shapes, launch_context) as one JSON line on stdin; "
                         "end quietly on end-of-file")
    a = ap.parse_args(argv)
    out = private_stdout()
    shapes: list[dict] = []
    try:
        from tools.task import load_task
        task = load_task(a.task)
        mod = task.module()
        if a.job_stdin:
            _warm_up(task)
            line = sys.stdin.readline()
            if not line.strip():
                return 0      # never given a job (the agent moved on, or died)
            for k, v in json.loads(line).items():
                setattr(a, k, json.dumps(v) if k in ("shapes", "launch_context") and v is not None else v)
        if not a.lib:
            raise ValueError("no --lib given")
        shapes = json.loads(a.shapes) if a.shapes else [dict(task.spec.main)]
        lib = load_lib(a.lib)
        if a.mode == "parity":
            from tools.parity import check
            result = check(task, mod, lib, seed=a.seed, hidden=not a.no_hidden).model_dump(mode="json")
        elif a.mode == "bench":
            from tools.bench import measure
            base = load_lib(a.baseline_lib) if a.baseline_lib else None
            res = measure(task, mod, lib, baseline=base, shapes=shapes, with_reference=not a.no_reference)
            result = {"results": [r.model_dump(mode="json") for r in res]}
        else:
            launch = None
            if a.launch_context:
                _mark("launch")
                launch = static_launch(task, mod, lib, json.loads(a.launch_context))
                if launch["status"] != "ok":
                    out.write(json.dumps({"launch": launch, "parity": None, "bench": None}) + "\n")
                    out.flush()
                    return 0
            base = load_lib(a.baseline_lib) if a.baseline_lib else None
            par, res = parity_then_bench(task, mod, lib, base, seed=a.seed, shapes=shapes, hidden=not a.no_hidden,
                                         with_reference=not a.no_reference, mark=_mark)
            result = {"launch": launch, "parity": par.model_dump(mode="json"),
                      "bench": None if res is None else {"results": [r.model_dump(mode="json") for r in res]}}
    except Exception as e:  # a bad task, a library that does not load, a missing symbol: one line
        msg = " ".join(str(e).split())[:500]
        result = _error_json(a.mode, f"{a.mode} could not run: {type(e).__name__}: {msg}", shapes)
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    # before any candidate code is loaded: writes only in this process's scratch directory
    from tools.confine import fence_scratch
    fence_scratch()
    sys.exit(main())

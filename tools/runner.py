"""The child-process entry: load a task module and a candidate library, run parity or bench work.

    python -m tools.runner parity --task DIR --lib PATH [--seed N] [--no-hidden]
    python -m tools.runner bench  --task DIR --lib PATH [--baseline-lib PATH] [--shapes JSON] [--no-reference]
The loop's candidate check (launch plan, parity, bench) is no longer here: it is tools/judge.py,
which loads no candidate code and runs the candidate in a host (tools/host.py). These two modes
(the CLIs of tools.parity and tools.bench, the confirmation bench) and the helpers below, shared with
the sweep's batch child, still check in the process that loads the candidate.

The parent (tools/parity.py, tools/bench.py) runs this through tools.sandbox (run_python_json), in a
new session with a timeout; a segfault, a hang or a poisoned CUDA context dies with this process. The last line on stdout is the one JSON result. Anything the kernel or the task prints
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
    from tools.launch import from_context
    t0 = time.monotonic()
    try:
        data = plan_from(mod, lib, {k: (v if isinstance(v, bool) else int(v)) for k, v in task.spec.main.items()},
                         task.spec.module)
    except Exception as e:  # the task's launch_plan raised
        data = {"ok": False, "error": f"launch_plan raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    res = from_context(task, data, ctx)
    res.seconds = time.monotonic() - t0
    return res.model_dump(mode="json")


def warm_up(task) -> None:
    """What a job would pay first: torch and, for a CUDA task, the device's context."""
    import torch
    if task.spec.device == "cuda" and torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.runner")
    ap.add_argument("mode", choices=["parity", "bench"])
    ap.add_argument("--task", required=True)
    ap.add_argument("--lib")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hidden", action="store_true")
    ap.add_argument("--baseline-lib")
    ap.add_argument("--shapes", help="JSON list of shape dicts (bench; default the main shape)")
    ap.add_argument("--no-reference", action="store_true")
    a = ap.parse_args(argv)
    out = private_stdout()
    shapes: list[dict] = []
    try:
        from tools.task import load_task
        task = load_task(a.task)
        mod = task.module()
        if not a.lib:
            raise ValueError("no --lib given")
        shapes = json.loads(a.shapes) if a.shapes else [dict(task.spec.main)]
        lib = load_lib(a.lib)
        if a.mode == "parity":
            from tools.parity import check
            result = check(task, mod, lib, seed=a.seed, hidden=not a.no_hidden).model_dump(mode="json")
        else:
            from tools.bench import measure
            base = load_lib(a.baseline_lib) if a.baseline_lib else None
            res = measure(task, mod, lib, baseline=base, shapes=shapes, with_reference=not a.no_reference)
            result = {"results": [r.model_dump(mode="json") for r in res]}
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

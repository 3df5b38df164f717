"""What the processes that load a candidate share: a private stdout, loading a library, warming up
torch, and (for the sweep's batch child, which checks in-process) parity then bench and the static
launch check on the plan of a library loaded there.

The loop's candidate check, run_parity and run_bench are tools/judge.py, which loads no candidate code
and runs the candidate in a host (tools/host.py). Only the sweep's batch child (tools/_batch_child.py)
still checks in the process that loads the candidate.
"""

from __future__ import annotations

import ctypes
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



def parity_then_bench(task, mod, lib, base, *, seed: int, shapes: list[dict], hidden: bool = True,
                      with_reference: bool = False, mark=lambda stage: None):
    """Parity, then (only if it passed) the bench against `base`, in this process: the sweep's batch
    child's candidate check. Returns (ParityResult, the
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

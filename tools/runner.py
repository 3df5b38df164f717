"""What the processes that load a candidate or judge one share: a private stdout, loading a library,
warming up torch.

Every candidate check is made by a judge that loads no candidate code: tools/judge.py (the loop's
check, run_parity and run_bench) and tools/_batch_child.py (a sweep's batch), each running the
candidate in a host (tools/host.py).
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



def warm_up(task) -> None:
    """What a job would pay first: torch and, for a CUDA task, the device's context."""
    import torch
    if task.spec.device == "cuda" and torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")

"""What the processes that load a candidate or judge one share: a private stdout.

Every candidate check is made by a judge that loads no candidate code: tools/judge/judge.py (the loop's
check, run_parity and run_bench) and tools/judge/_batch_child.py (a sweep's batch), each running the
candidate in a host (tools/judge/host.py). Loading the kernel and warming the device are the task's
backend's (tools/backends/backend.py).
"""

from __future__ import annotations

import os
import sys


def private_stdout():
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")

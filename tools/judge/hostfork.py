"""The kernel's host forked from the judge (tools/judge/hostclient.py starts it with `fork_host` where it can): no
second Python start and torch import, none of the judge's descriptors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.isolation.birth import become_child, exit_with


def fork_host(cwd: Path, env: dict[str, str]) -> Forked | None:
    """The host forked from this process where torch is imported here and no CUDA context exists yet
    (as torch's DataLoader forks its workers), so that it does not start Python and import torch again
    (1.3-1.6 s of CPU a check on a 2-core machine); None where that does not hold, and the host is
    started afresh. The child keeps nothing of this process's files: its stdin and stdout are the
    request pipes, its stderr this process's, and every other descriptor (this judge's private answer
    channel among them) is closed before the fence goes up and any candidate code loads."""
    torch = sys.modules.get("torch")
    if not sys.platform.startswith("linux") or torch is None or torch.cuda.is_initialized() \
            or threading.active_count() != 1:
        return None
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    parent = os.getpid()
    import gc
    gc.freeze()      # the judge's objects so far stay out of the host's collections (no copy on write)
    pid = os.fork()
    if pid == 0:   # the host; never returns into the judge's code
        def body() -> int:
            become_child(parent, [req_r, ans_w, 2], str(cwd), env, replace_env=False)
            from tools.isolation.confine import fence_scratch
            from tools.judge.host import main
            fence_scratch()
            return main()
        exit_with(body)
    os.close(req_r)
    os.close(ans_w)
    return Forked(pid, os.fdopen(req_w, "wb"), os.fdopen(ans_r, "rb"))


class Forked:
    """What HostClient uses of subprocess.Popen (stdin, stdout, poll, wait, kill), over a forked child."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["tools.judge.host (forked)"], timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

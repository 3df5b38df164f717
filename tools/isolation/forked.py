"""A child of the fork server (tools/isolation/forkserver.py), as tools/isolation/sandbox.py uses a subprocess.Popen:
its pipes read by the agent, its exit code from the server, which reaps it (only the server can wait for it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tools.isolation.capture import Capture, pump


class ForkedChild:
    """What tools.isolation.sandbox uses of subprocess.Popen, over a child of the fork server."""

    def __init__(self, server, pid: int, args: list[str], stdin_w, stdout_r: int, stderr_r: int):
        self.server, self.pid, self.args = server, pid, args
        self.stdin = os.fdopen(stdin_w, "w") if stdin_w is not None else None
        self._fds = {stdout_r: Capture(), stderr_r: Capture()}
        self._out, self._err = stdout_r, stderr_r
        self._open = {stdout_r, stderr_r}
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    @property
    def lost(self) -> str | None:     # why this child's exit code was made up (its server died first), or None
        return self.server.lost.get(self.pid)

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def communicate(self, input: str | None = None, timeout: float | None = None, clock=None) -> tuple[str, str]:
        """Write input, read both pipes to their end and wait for the exit, within timeout; on
        TimeoutExpired what was read so far is kept, and a second call goes on from there."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            self.stdin = None
        pump(self._fds, self._open, deadline, lambda: self.poll() is not None, os.close,
             lambda: subprocess.TimeoutExpired(self.args, timeout, output=self._text(self._out),
                                               stderr=self._text(self._err)), clock, self._err)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._text(self._out), self._text(self._err)

    def close_pipes(self) -> None:
        for fd in list(self._open):
            os.close(fd)
        self._open.clear()

    def _text(self, fd: int) -> str:
        return self._fds[fd].text()

    @property
    def dropped(self) -> int:
        return sum(c.dropped for c in self._fds.values())

    def __del__(self) -> None:
        try:
            self.close_pipes()
        except OSError:
            pass

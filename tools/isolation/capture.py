"""A child's stdout and stderr as the agent keeps them: capped, and never waited on past a deadline (issue 41).

A candidate that prints 4 MB on each of 25 calls grew the agent from 258 MB to 773 MB when its pipes were read
whole; a helper process that kept the inherited pipes open held a stage for 192 s after its leader had exited.
Each pipe is read into a Capture, which keeps the first HEAD_BYTES, the last TAIL_BYTES (the child's result is its
last stdout line, its error at the end of stderr) and, from what falls between, only the stage marks
(STAGE_MARK: which stage a crash is charged to), counting the bytes it dropped. `pump` reads
a child's pipes to their end within a deadline, and gives up on them PIPE_GRACE_S after the child itself ended:
whatever still holds them is a descendant, and the kill that follows takes it.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from typing import Callable

HEAD_BYTES = 64 << 10
TAIL_BYTES = 1 << 20
# a child that runs stages in turn writes this and the stage's name on stderr as it enters each, so that the parent can
# charge a crash or a timeout to the stage the child was in (tools.isolation.sandbox re-exports it)
STAGE_MARK = "@@agent-stage "
MARK = STAGE_MARK.encode()
MAX_MARKS = 64
PIPE_GRACE_S = 2.0


class Capture:
    """One pipe's bytes: the head, the tail, the stage-mark lines of what was dropped between, and its count."""

    def __init__(self) -> None:
        self.head, self.tail = bytearray(), bytearray()
        self.marks: list[bytes] = []
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if len(self.head) < HEAD_BYTES:
            take = HEAD_BYTES - len(self.head)
            self.head += chunk[:take]
            chunk = chunk[take:]
        self.tail += chunk
        if len(self.tail) > 2 * TAIL_BYTES:      # trimmed in halves: each byte is moved O(1) times
            self._drop(len(self.tail) - TAIL_BYTES)

    def _drop(self, n: int) -> None:
        """Drop the tail's first n bytes, keeping the stage-mark lines that start in them."""
        before = self.head[-1:] if not self.dropped else self._before
        data = bytes(before) + bytes(self.tail[:n])     # one byte before: does the first line start a line?
        i = data.find(b"\n" + MARK)
        while i != -1 and len(self.marks) < MAX_MARKS:
            b = i + 1
            e = data.find(b"\n", b)
            line = data[b:e] if e != -1 else data[b:] + bytes(self.tail[n:n + 200]).split(b"\n", 1)[0]
            self.marks.append(line[:200])
            i = -1 if e == -1 else data.find(b"\n" + MARK, e)
        self._before = data[-1:]
        del self.tail[:n]
        self.dropped += n

    def text(self) -> str:
        if not self.dropped:
            return (bytes(self.head) + bytes(self.tail)).decode(errors="replace")
        middle = b"".join(m + b"\n" for m in self.marks)
        note = f"\n[agent: {self.dropped} bytes of this output dropped here]\n".encode()
        return (bytes(self.head) + note + middle + bytes(self.tail)).decode(errors="replace")


def pump(caps: dict[int, Capture], open_fds: set[int], deadline: float | None, ended: Callable[[], bool],
         close: Callable[[int], None], on_timeout: Callable[[], Exception], clock=None, clock_fd: int | None = None) -> None:
    """Read the open pipes into their Captures until each is at its end, closing each there (`close(fd)`); the
    child is `ended()` when it has exited. At the deadline, raise `on_timeout()` (what was read is kept); pipes
    still open PIPE_GRACE_S after the child ended are closed unread: their writer is a descendant, never waited on.
    `clock` (tools.judge.budgets.StageClock) reads `clock_fd`'s bytes as they come and may bring the deadline
    nearer (`clock.deadline()`: the stage's)."""
    grace_end, overall = None, deadline
    while open_fds:
        now = time.monotonic()
        if clock is not None:
            deadline = _nearer(overall, clock.deadline())
            if deadline is not None and now >= deadline:
                # what is already in the pipes first: a stage mark that came in time moves the deadline (one chunk a
                # pipe: a flood cannot hold the deadline off)
                for fd in select.select(list(open_fds), [], [], 0)[0]:
                    _read(fd, caps, open_fds, close, clock, clock_fd)
                deadline = _nearer(overall, clock.deadline())
        if deadline is not None and now >= deadline:
            raise on_timeout()
        if grace_end is None and ended():
            grace_end = now + PIPE_GRACE_S
        if grace_end is not None and now >= grace_end:
            for fd in list(open_fds):
                close(fd)
            open_fds.clear()
            return
        limits = [t - now for t in (deadline, grace_end) if t is not None] + [0.25]
        ready, _, _ = select.select(list(open_fds), [], [], max(0.0, min(limits)))
        for fd in ready:
            _read(fd, caps, open_fds, close, clock, clock_fd)


def _read(fd: int, caps: dict[int, Capture], open_fds: set[int], close, clock, clock_fd: int | None) -> None:
    chunk = os.read(fd, 1 << 16)
    if chunk:
        caps[fd].add(chunk)
        if clock is not None and fd == clock_fd:
            clock.feed(chunk)
    else:
        close(fd)
        open_fds.discard(fd)


def _nearer(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class CappedPopen(subprocess.Popen):
    """subprocess.Popen (bytes pipes) whose communicate() reads through Captures and pump: the same promises as
    tools.isolation.forkserver.ForkedChild's; `dropped` is what both pipes left out."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._caps = {f.fileno(): Capture() for f in (self.stdout, self.stderr) if f is not None}
        self._open = set(self._caps)
        self._fd_out = self.stdout.fileno() if self.stdout is not None else None
        self._fd_err = self.stderr.fileno() if self.stderr is not None else None

    @property
    def dropped(self) -> int:
        return sum(c.dropped for c in self._caps.values())

    def _texts(self) -> tuple[str, str]:
        return tuple(self._caps[fd].text() if fd in self._caps else "" for fd in (self._fd_out, self._fd_err))

    def communicate(self, input=None, timeout=None, clock=None):   # noqa: A002 (Popen's own signature)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input.encode() if isinstance(input, str) else input)
                self.stdin.close()
            except (BrokenPipeError, ValueError, OSError):
                pass
            self.stdin = None
        files = {f.fileno(): f for f in (self.stdout, self.stderr) if f is not None and not f.closed}
        pump(self._caps, self._open, deadline, lambda: self.poll() is not None, lambda fd: files[fd].close(),
             lambda: subprocess.TimeoutExpired(self.args, timeout, *self._texts()), clock, self._fd_err)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._texts()

    def close_pipes(self) -> None:
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        self._open.clear()

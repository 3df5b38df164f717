"""A process's first steps, shared by the children forked from a warm parent (tools/isolation/forkserver.py's
judges, tools/judge/hostfork.py's hosts) and by the children started afresh that must die with their parent."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent() -> None:
    """SIGKILL for this process when its parent dies (PR_SET_PDEATHSIG)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def die_with(parent: int) -> None:
    """Death with `parent` (PR_SET_PDEATHSIG), and exit now if it died before the death signal was set."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(137)


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but `keep` (nothing of the parent's: its sockets, its pipes)."""
    for fd in {int(f) for f in os.listdir("/proc/self/fd")} - keep:
        try:
            os.close(fd)
        except OSError:
            pass


def become_child(parent: int, fds: list[int], cwd: str, env: dict[str, str], *, replace_env: bool) -> None:
    """In a process just forked from `parent`, before any of its own code: death with the parent (and
    exit if it is already gone), SIGINT as by default, `fds` as its stdin, stdout (and stderr), every
    other descriptor closed (nothing of the parent's: its answer channel, its sockets), `cwd`, `env`
    (over the parent's, or instead of it), and sys's streams rebuilt over the new descriptors."""
    die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    close_all_but({0, 1, 2})
    os.chdir(cwd)
    if replace_env:
        os.environ.clear()
    os.environ.update(env)
    import tempfile
    tempfile.tempdir = None
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.environ.get("PYTHONUNBUFFERED") else -1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)


def exit_with(body) -> None:
    """Run body() in a forked child and leave the process with its code: never returns into the code
    the child was forked from (SystemExit's code, 1 for any other exception, with its traceback)."""
    rc = 1
    try:
        rc = body()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 0)

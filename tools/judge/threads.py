"""Threads a kernel leaves running after its call returned (issue 62, state left behind): read in the kernel's host.

A kernel may keep threads between calls (a pool whose workers wait on a condition variable, as an OpenMP runtime
keeps its own): they cost its caller nothing while it is not called, and parity only names them. A thread that goes
on computing after the call returned does cost: a worker that spins on a flag for the next call ("no wake-up
latency"), a spinner that keeps the core's clock up, work finished after the return. It takes a core from every
other thing the caller's program does, and it is invisible to a figure taken on an idle machine (the issue's twelfth
adversary measured 0.997x). Before a keep the judge asks the host for `idle` (tools/judge/judge.py): the host's main
thread sleeps through a short settle and then a window, and every other thread's CPU time over the window is read
from /proc (schedstat, in nanoseconds; else stat's clock ticks). Threads on a CPU together for at least a third of
the window fail the candidate `side_effect`, the busiest named. An OpenMP runtime's workers spin a few milliseconds after a parallel region
before they sleep: the settle and the share leave that out.
"""

from __future__ import annotations

import os
import time

SETTLE_S = 0.05       # after the last call, before the window: a runtime's workers stop spinning within it
WINDOW_S = 0.15
SHARE = 1 / 3         # of the window on a CPU: running, not waiting


def ids() -> set[str]:
    """This process's thread ids now (/proc/self/task; empty where there is none)."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def names(but: set[str] | None = None) -> dict[str, str]:
    """This process's threads now, but those in `but`: id -> name (/proc/self/task; empty where there is none). The
    host asks after every call for the threads the call started: the names of those alone are read (a GPU host has
    dozens of threads; every check makes four calls)."""
    out = {}
    try:
        for tid in set(os.listdir("/proc/self/task")) - (but or set()):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    out[tid] = f.read().strip()
            except OSError:
                continue
    except OSError:
        pass
    return out


def _cpu_ns(tid: str) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cpu_times() -> dict[str, tuple[str, int]]:
    """Every thread of this process but the calling one: id -> (name, nanoseconds on a CPU so far)."""
    me = str(getattr(os, "gettid", os.getpid)())
    out = {}
    for tid, name in names().items():
        if tid != me and (ns := _cpu_ns(tid)) is not None:
            out[tid] = (name, ns)
    return out


def running(settle_s: float = SETTLE_S, window_s: float = WINDOW_S, share: float = SHARE) -> list[dict]:
    """The threads that were on a CPU while this one slept through a `window_s` window (after `settle_s`), busiest
    first, where together they were for at least `share` of it: [{tid, name, cpu_ms, window_ms}]; else []."""
    time.sleep(settle_s)
    before, t0 = cpu_times(), time.monotonic()
    time.sleep(window_s)
    after, wall = cpu_times(), time.monotonic() - t0
    ran = sorted(((ns - before[tid][1], tid, name) for tid, (name, ns) in after.items() if tid in before), reverse=True)
    if sum(ns for ns, _, _ in ran) < share * wall * 1e9:    # all of them together: two spinners on a busy machine
        return []
    return [{"tid": int(tid), "name": name, "cpu_ms": round(ns / 1e6, 1), "window_ms": round(wall * 1e3, 1)}
            for ns, tid, name in ran if ns >= 0.05 * wall * 1e9]


def describe(busy: list[dict]) -> str:
    """One line for the judge's verdict."""
    first = busy[0]     # the host's answer: data, read with care
    num = lambda k: float(first.get(k)) if isinstance(first.get(k), (int, float)) else 0.0  # noqa: E731
    more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
    return (f"a thread the kernel started kept running after its calls returned: thread {num('tid'):.0f} "
            f"({str(first.get('name'))[:40]!r}) was on a CPU {num('cpu_ms'):.0f} ms of a {num('window_ms'):.0f} ms window while "
            f"nothing called the kernel{more}: it takes a core from everything its caller does next (a pool's "
            "workers wait on a condition variable or a futex between calls, they do not spin)")

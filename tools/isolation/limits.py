"""Resource limits on the process that runs a candidate's code (the judge's host, tools/judge/host.py), set before any
candidate library is loaded (issue 41). What each guards, and where a limit cannot be set:

- RLIMIT_CPU: CPU seconds, the task's parity and bench timeouts times the cores (a spinning kernel on every thread
  is stopped by the stage budget first; this is the bound on what it burns). SIGXCPU names it.
- RLIMIT_FSIZE: the largest file it may write, half the free space of its scratch directory's filesystem (1 GiB at
  the least): a runaway writer's writes fail there (EFBIG: Python ignores SIGXFSZ) before the disk is full; the
  judge's file check names the limit.
- RLIMIT_NOFILE: 4096 open descriptors (or the hard limit, if lower): a leak fails with EMFILE in the kernel.
- RLIMIT_NPROC: the user's processes now plus 512: a fork bomb fails with EAGAIN. Not enforced for root
  (CAP_SYS_RESOURCE): there the seccomp filter of tools/isolation/nofork.py (no process starts in a CPU host at
  all) and the kill of the host's tree at the stage's end are what stop it.
- RLIMIT_AS: the machine's physical memory (16 GiB at the least: a small machine's host still maps torch and a
  malloc arena per thread), CPU tasks only. A CUDA process reserves address space far past the memory it uses
  (unified addressing), so a GPU host has none.
"""

from __future__ import annotations

import os
import resource
import signal

FILES = 4096
EXTRA_PROCS = 512
MIN_FSIZE = 1 << 30
MIN_AS = 16 << 30

NAMES = {"cpu_s": "RLIMIT_CPU", "fsize_bytes": "RLIMIT_FSIZE", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC",
         "as_bytes": "RLIMIT_AS"}
# the signal a limit sends when it fires, and the limit
BY_SIGNAL = {signal.SIGXCPU: "cpu_s", signal.SIGXFSZ: "fsize_bytes"}


def _user_procs() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                n += os.stat(f"/proc/{d}").st_uid == uid
            except OSError:
                pass
    return n


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def wanted(gpu: bool, timeouts_s: float, scratch: str) -> dict[str, int]:
    """The limits for a host: name -> value (see the module's docstring). AGENT_HOST_LIMITS ("name=value,...")
    overrides any of them (tests, or a user whose kernel needs more)."""
    st = os.statvfs(scratch)
    out = {"cpu_s": int(timeouts_s * (os.cpu_count() or 1)) + 60,
           "fsize_bytes": max(MIN_FSIZE, st.f_bavail * st.f_frsize // 2),
           "nofile": FILES, "nproc": _user_procs() + EXTRA_PROCS}
    mem = _mem_total()
    if not gpu and mem:
        out["as_bytes"] = max(mem, MIN_AS)
    for item in filter(None, os.environ.get("AGENT_HOST_LIMITS", "").split(",")):
        name, _, value = item.partition("=")
        if name.strip() in NAMES:
            out[name.strip()] = int(value)
    return out


def apply(limits: dict[str, int]) -> dict[str, int]:
    """Lower this process's soft limits to `limits` (never above a hard limit, never raised); returns what is in
    force for each, -1 for unlimited."""
    got = {}
    for name, value in limits.items():
        res = getattr(resource, NAMES[name])
        soft, hard = resource.getrlimit(res)
        new = value if hard == resource.RLIM_INFINITY else min(value, hard)
        if soft == resource.RLIM_INFINITY or new < soft:
            try:
                resource.setrlimit(res, (new, hard))
            except (ValueError, OSError):
                pass
        soft = resource.getrlimit(res)[0]
        got[name] = -1 if soft == resource.RLIM_INFINITY else int(soft)
    return got


def fired(sig: int, limits: dict) -> str | None:
    """The limit a host killed by `sig` ran into, in words, or None."""
    name = BY_SIGNAL.get(sig)
    if name is None:
        return None
    value = limits.get(name)
    what = {"cpu_s": f"its CPU-time limit ({NAMES[name]}, {value} s)",
            "fsize_bytes": f"its file-size limit ({NAMES[name]}, {value} bytes): the kernel wrote a file that large"}
    return what[name]

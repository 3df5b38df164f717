"""The GPU's device-wide settings a kernel's host code can change and must put back (issue 62, state left behind).

A launcher that sets a context-wide limit or preference for its own kernel and returns without restoring it leaves
every other kernel of its caller's process under it: the persisting L2 set-aside (`cudaDeviceSetLimit(
cudaLimitPersistingL2CacheSize, ...)`) shrinks the L2 the caller's other kernels share; an L1/shared-memory preference
(`cudaDeviceSetCacheConfig`) is applied to every kernel that does not set its own; the stack, heap and printf limits
reserve device memory; `cudaSetDeviceFlags(cudaDeviceScheduleSpin)` makes each of the caller's synchronizations spin
a CPU core. A kernel's own function attributes (`cudaFuncSetCacheConfig`, `cudaFuncSetAttribute`) are its own and
not read here.

The kernel's host (tools/judge/host.py) reads these through the driver API (libcuda's cuCtxGetLimit,
cuCtxGetCacheConfig, cuCtxGetFlags: the current context's, whichever CUDA runtime copy the kernel linked) once its
context is up and after each request that loaded or called a library, as it reads the floating-point state
(tools/judge/fpstate.py); a difference is named and put back, and the judge fails the candidate `side_effect`.
Where libcuda or a context is missing (a CPU task, the CPU CI) there is nothing to read.
"""

from __future__ import annotations

import ctypes

from tools.judge.devshare import driver as _driver   # libcuda, loaded once

# CUlimit: what each is, by value (cuda.h). Not the stack size per thread (0): the driver raises it itself for a kernel
# that needs more (its documented behaviour), and never lowers it again
LIMITS = {1: "the printf FIFO size", 2: "the device malloc heap size",
          3: "the device runtime's sync depth", 4: "the device runtime's pending launch count",
          5: "the L2 fetch granularity", 6: "the persisting L2 cache size"}
CACHE = {0: "no preference", 1: "prefer shared memory", 2: "prefer L1", 3: "equal L1 and shared memory"}
SCHED = {0: "auto", 1: "spin", 2: "yield", 4: "blocking sync"}


def snapshot() -> dict[str, int] | None:
    """The current context's settings by name, or None where there is no driver or no current context."""
    cu = _driver()
    if cu is None:
        return None
    ctx = ctypes.c_void_p()
    if cu.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return None
    out: dict[str, int] = {}
    for limit in LIMITS:
        v = ctypes.c_size_t()
        if cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(limit)) == 0:
            out[f"limit{limit}"] = v.value
    cache, flags = ctypes.c_int(), ctypes.c_uint()
    if cu.cuCtxGetCacheConfig(ctypes.byref(cache)) == 0:
        out["cache"] = cache.value
    if hasattr(cu, "cuCtxGetFlags") and cu.cuCtxGetFlags(ctypes.byref(flags)) == 0:
        out["sched"] = flags.value & 0x7
    return out


def restore(snap: dict[str, int]) -> None:
    """Put the settings back (best effort: the next candidate's host is a fresh process anyway)."""
    cu = _driver()
    if cu is None:
        return
    for key, v in snap.items():
        if key.startswith("limit"):
            cu.cuCtxSetLimit(ctypes.c_int(int(key[5:])), ctypes.c_size_t(v))
        elif key == "cache":
            cu.cuCtxSetCacheConfig(ctypes.c_int(v))
        elif key == "sched" and hasattr(cu, "cuCtxSetFlags"):
            cu.cuCtxSetFlags(ctypes.c_uint(v))


def describe(before: dict[str, int], after: dict[str, int]) -> str | None:
    """The settings that differ, in words, or None."""
    moved = []
    for key in sorted(before):
        if key not in after or after[key] == before[key]:
            continue
        b, a = before[key], after[key]
        if key.startswith("limit"):
            moved.append(f"{LIMITS.get(int(key[5:]), key)} {b} -> {a} bytes" if int(key[5:]) in (1, 2, 6)
                         else f"{LIMITS.get(int(key[5:]), key)} {b} -> {a}")
        elif key == "cache":
            moved.append(f"the cache preference {CACHE.get(b, b)} -> {CACHE.get(a, a)}")
        else:
            moved.append(f"the context's scheduling {SCHED.get(b, b)} -> {SCHED.get(a, a)}")
    return ", ".join(moved) or None


class Watch:
    """The settings the host found once its context was up; `check(after)` names and puts back a difference."""

    def __init__(self) -> None:
        self.base = snapshot()

    def check(self, after_what: str) -> str | None:
        if self.base is None:
            return None
        now = snapshot()
        if now is None:
            return None
        what = describe(self.base, now)
        if what is None:
            return None
        restore(self.base)
        return f"{what}, left by {after_what}"

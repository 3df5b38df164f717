"""The floating-point control state of the calling thread: what a kernel can change for speed and must put back
(issue 62, state left behind).

A kernel that sets flush-to-zero and denormals-are-zero, a rounding mode or an unmasked trap for its own loop and
returns without restoring it computes its own outputs right; every float operation its caller does afterwards on that
thread does not (torch's next subnormal result is zero). So is a library built with gcc's -ffast-math at link time
(gcc before 13 links crtfastmath.o into a shared library: FTZ and DAZ set when it is loaded; tools.build.build keeps
those flags out of the link). The kernel's host reads this state when it starts, after each library it loads and
after each request that called into one; a difference is named and the state put back, and the judge fails the
candidate `side_effect` with that name (tools.judge.judge, tools.judge._batch_child).

Read with the C library's fegetenv (glibc's fenv_t: on x86-64 the x87 control word and MXCSR; on aarch64 FPCR), the
sticky exception flags left out (ordinary arithmetic sets them: inexact, underflow). Elsewhere, fegetround only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from functools import lru_cache

_MACHINE = platform.machine().lower()
# MXCSR: bits 0-5 are the sticky exception flags; 6 DAZ, 7-12 the exception masks, 13-14 rounding, 15 FTZ
_MXCSR_CONTROL = 0xFFC0
# x87 control word: 0-5 exception masks, 8-9 precision, 10-11 rounding
_X87_CONTROL = 0x0F3F
_ROUND = {0: "to nearest", 1: "down", 2: "up", 3: "toward zero"}


@lru_cache(maxsize=1)
def _libm():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        lib.fegetenv.argtypes = lib.fesetenv.argtypes = [ctypes.c_void_p]
        return lib
    except (OSError, AttributeError):
        return None


def snapshot() -> tuple[bytes, dict[str, int]] | None:
    """(the whole environment, to put back; its control fields by name), or None where it cannot be read."""
    lib = _libm()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(256)          # larger than any fenv_t
    if lib.fegetenv(buf) != 0:
        return None
    raw = buf.raw
    if _MACHINE in ("x86_64", "amd64") and ctypes.sizeof(ctypes.c_void_p) == 8:
        return raw, {"mxcsr": int.from_bytes(raw[28:32], "little") & _MXCSR_CONTROL,
                     "x87": int.from_bytes(raw[0:2], "little") & _X87_CONTROL}
    if _MACHINE in ("aarch64", "arm64"):
        return raw, {"fpcr": int.from_bytes(raw[0:4], "little")}
    return raw, {"round": int(lib.fegetround())}


def restore(snap: tuple[bytes, dict[str, int]]) -> None:
    lib = _libm()
    if lib is not None:
        buf = ctypes.create_string_buffer(snap[0], len(snap[0]))
        lib.fesetenv(buf)


def describe(before: dict[str, int], after: dict[str, int]) -> str | None:
    """What changed between two control states, in words, or None where nothing did."""
    if before == after:
        return None
    said = []
    if "mxcsr" in before:
        b, a = before["mxcsr"], after["mxcsr"]
        for bit, name in ((15, "flush-to-zero (FTZ)"), (6, "denormals-are-zero (DAZ)")):
            if (a >> bit & 1) != (b >> bit & 1):
                said.append(f"{name} {'set' if a >> bit & 1 else 'cleared'}")
        if (a >> 13 & 3) != (b >> 13 & 3):
            said.append(f"SSE rounding {_ROUND[b >> 13 & 3]} -> {_ROUND[a >> 13 & 3]}")
        if (a >> 7 & 0x3F) != (b >> 7 & 0x3F):
            said.append("SSE exception masks changed" + (" (a trap unmasked)" if a >> 7 & 0x3F < b >> 7 & 0x3F else ""))
        if a != b:
            said.append(f"MXCSR {b:#06x} -> {a:#06x}")
        if before["x87"] != after["x87"]:
            said.append(f"x87 control word {before['x87']:#06x} -> {after['x87']:#06x}")
    elif "fpcr" in before:
        b, a = before["fpcr"], after["fpcr"]
        if (a >> 24 & 1) != (b >> 24 & 1):
            said.append(f"flush-to-zero (FPCR.FZ) {'set' if a >> 24 & 1 else 'cleared'}")
        if (a >> 22 & 3) != (b >> 22 & 3):
            said.append("rounding mode changed (FPCR.RMode)")
        said.append(f"FPCR {b:#010x} -> {a:#010x}")
    else:
        said.append(f"rounding mode {before['round']} -> {after['round']} (fegetround)")
    return ", ".join(said)


class Watch:
    """The host's view: the state it started with, and each change since named once and put back."""

    def __init__(self) -> None:
        self.start = snapshot()

    def check(self, where: str) -> str | None:
        """None where the state is as the host started; else what changed (`where`: the request that changed it),
        the start's state put back so that the next request is judged on its own."""
        if self.start is None:
            return None
        now = snapshot()
        why = describe(self.start[1], now[1]) if now is not None else None
        if why is None:
            return None
        restore(self.start)
        return f"{why}, left by {where}"

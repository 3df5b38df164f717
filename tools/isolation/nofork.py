"""No new processes from the process that runs a candidate's code (the judge's host; issue 41): a seccomp filter
that fails fork, vfork and every clone that is not a thread's with EPERM, and clone3 with ENOSYS (its flags sit in a
struct a filter cannot read; glibc then makes its threads with clone, as under Docker's default profile). Threads
(torch's, OpenMP's, the kernel's own) still start; a process does not, whoever the user is: RLIMIT_NPROC does not
hold for root, and a fork bomb's children would outrun the kill of the host's tree. The filter goes on every
thread the process has (SECCOMP_FILTER_FLAG_TSYNC) and on every thread it starts after; it cannot be taken off.

A GPU host gets it too (tools/judge/host.py; the CUDA driver and compute-sanitizer's memcheck and racecheck run under
it: `AGENT_HOST_NOFORK=1 agent check` and the GPU tests on an H200): a forked child holds the host's CUDA context past
the host's kill, and its kernels keep the GPU. AGENT_HOST_NOFORK=0 leaves it off.
"""

from __future__ import annotations

import ctypes
import platform

# linux/seccomp.h, linux/filter.h, linux/sched.h
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_NO_NEW_PRIVS, _SET_MODE_FILTER, _TSYNC = 38, 1, 1
CLONE_THREAD = 0x00010000
EPERM, ENOSYS = 1, 38
# machine -> (AUDIT_ARCH, the seccomp syscall's number, the numbers of the calls that start a process)
ARCHES = {"x86_64": (0xC000003E, 317, {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435}),
          "aarch64": (0xC00000B7, 277, {"clone": 220, "clone3": 435})}


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def program(arch: int, nrs: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k): seccomp_data is nr at 0, arch at 4, args[0] (its low word) at 16."""
    body: list = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 0, "allow", arch), (_LD_W_ABS, 0, 0, 0)]
    for name in ("fork", "vfork"):
        if name in nrs:
            body.append((_JEQ_K, "eperm", 0, nrs[name]))
    body += [(_JEQ_K, "enosys", 0, nrs["clone3"]), (_JEQ_K, 0, "allow", nrs["clone"]),
             (_LD_W_ABS, 0, 0, 16), (_JSET_K, "allow", "eperm", CLONE_THREAD)]
    labels = {"allow": len(body), "eperm": len(body) + 1, "enosys": len(body) + 2}
    body += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | EPERM), (_RET_K, 0, 0, _RET_ERRNO | ENOSYS)]
    # a jump is relative to the next instruction
    return [(code, labels[jt] - i - 1 if isinstance(jt, str) else jt, labels[jf] - i - 1 if isinstance(jf, str) else jf, k)
            for i, (code, jt, jf, k) in enumerate(body)]


def install() -> str | None:
    """Put the filter on this process's threads; None when it is on, else why not (an unknown machine, a kernel
    without seccomp): the caller says so, nothing else changes."""
    machine = platform.machine()
    if machine not in ARCHES:
        return f"no seccomp filter for {machine}"
    arch, seccomp_nr, nrs = ARCHES[machine]
    insns = program(arch, nrs)
    buf = (_Insn * len(insns))(*[_Insn(*t) for t in insns])
    prog = _Prog(len(insns), ctypes.cast(buf, ctypes.POINTER(_Insn)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}"
    got = libc.syscall(ctypes.c_long(seccomp_nr), ctypes.c_ulong(_SET_MODE_FILTER), ctypes.c_ulong(_TSYNC),
                       ctypes.byref(prog))
    if got != 0:
        return (f"seccomp failed: errno {ctypes.get_errno()}" if got < 0 else
                f"seccomp could not reach thread {got} (TSYNC)")
    return None

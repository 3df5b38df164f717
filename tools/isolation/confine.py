"""A fence around a process that loads a candidate: it may write only in its scratch directory.

`fence_scratch()` is called by each child that loads candidate code (the judge's host tools/judge/host.py, the
launch-plan and batch children) before it loads any: with Landlock (Linux >= 5.13, unprivileged, irrevocable,
inherited by everything the process starts) the process may then create, write, truncate, rename or
delete files only beneath its scratch directory ($AGENT_SCRATCH, tools/isolation/scratch.py) and write to a few
device files (/dev/null, the GPU's /dev/nvidia*). A write by absolute path into the user's checkout,
beside the library or anywhere else fails with EACCES. Where the kernel has Landlock ABI 6, the
process also cannot signal processes outside its own domain (the agent, the judge of its results).
Reads stay open: the interpreter, torch and the task's files are read from everywhere.

What it does not do: name the write it refused (the kernel's call fails; nothing reaches us), fence
a machine without Landlock (`describe()` says so, and the checkout comparison is all there is), or
keep the candidate from lying to the checker it shares a process with (that is the judge's job).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from functools import lru_cache

# linux/landlock.h (the syscall numbers are the same on x86_64 and aarch64)
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FS_WRITE_FILE, _FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_FS_MAKE = sum(1 << b for b in range(6, 13))          # char, dir, reg, sock, fifo, block, sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14            # ABI 2, ABI 3
_SCOPE_SIGNAL = 1 << 1                               # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


@lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or it is disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        r = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(r))


def device_files() -> list[str]:
    """Device files a kernel host must be able to open for writing: /dev/null and the GPU's."""
    return [p for p in ["/dev/null", "/dev/zero", "/dev/full", *sorted(glob.glob("/dev/nvidia*")),
                        *sorted(glob.glob("/dev/nvidia-caps/*")), *sorted(glob.glob("/dev/dri/*"))]
            if os.path.exists(p)]




def describe() -> str:
    """One line: what the fence does on this machine."""
    abi = landlock_abi()
    if abi == 0:
        return "no write fence: Landlock is unavailable on this kernel (writes outside are not prevented)"
    return f"Landlock ABI {abi}: writes only in the scratch directory" + (", no signals out" if abi >= 6 else "")


def fence_scratch(scratch: str | None = None, also: tuple[str, ...] = ()) -> bool:
    """Confine this process (and what it starts) to writing in `scratch` (default $AGENT_SCRATCH), and in
    $AGENT_IO where that is set (a host's buffer files in memory, tools/judge/iofiles.py), and in the folders `also`
    names (the Nsight Compute lock's, tools/profile/target.py). Returns whether a fence was applied; no scratch
    directory or no Landlock: nothing (False)."""
    scratch = scratch or os.environ.get("AGENT_SCRATCH")
    if not scratch or not os.path.isdir(scratch) or landlock_abi() == 0:
        return False
    io = os.environ.get("AGENT_IO")
    # the CUDA driver writes files of its own process under /proc/PID: without that, no device
    # (cudaGetDeviceCount: error 304, on the H200 host); /proc/PID/mem of another process stays out of
    # reach (Landlock refuses ptrace access outside the domain)
    _landlock([scratch, *([io] if io and os.path.isdir(io) else []), *(a for a in also if os.path.isdir(a))],
              device_files() + [f"/proc/{os.getpid()}"],
              landlock_abi())
    return True


def _landlock(writable: list[str], devices: list[str], abi: int) -> None:
    libc = _libc()
    fs = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE
    fs |= _FS_REFER if abi >= 2 else 0
    fs |= _FS_TRUNCATE if abi >= 3 else 0
    attr = _RulesetAttr(fs, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        file_rights = _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
        for path in writable:
            _allow(libc, fd, path, fs)
        for path in devices:
            _allow(libc, fd, path, file_rights)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)


def _allow(libc, ruleset: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return   # gone (a device that is not there): nothing to allow
    try:
        rule = _PathBeneath(rights, pfd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
    finally:
        os.close(pfd)

"""What the GPU allows (DeviceLimits), from the device itself or a table by arch, plus the small
environment probes `agent doctor` shows (nvcc, ncu, driver, counter permission).

On a machine without a GPU the limits come from the table (source="table", named in `name`),
so the static launch check still runs in CI; on the GPU they are read with torch (source="device").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel

from tools.results import DeviceLimits
from tools.backends.toolchain import find_ncu, find_nvcc, ncu_python_dirs

# opt-in shared memory per block (bytes), SMs, registers per SM: the usual part for each arch
_TABLE: dict[str, dict] = {
    "sm_70": dict(name="V100 SXM2", sm_count=80, max_smem_per_block_optin=98304),
    "sm_75": dict(name="T4", sm_count=40, max_smem_per_block_optin=65536),
    "sm_80": dict(name="A100 SXM", sm_count=108, max_smem_per_block_optin=166912),
    "sm_86": dict(name="A10", sm_count=72, max_smem_per_block_optin=101376),
    "sm_89": dict(name="L4", sm_count=58, max_smem_per_block_optin=101376),
    "sm_90": dict(name="H100 SXM", sm_count=132, max_smem_per_block_optin=232448),
    "sm_100": dict(name="B200", sm_count=148, max_smem_per_block_optin=232448),
}
DEFAULT_ARCH = "sm_90"


def cuda_present() -> bool:
    """Cheap: is there an NVIDIA driver here at all? (no torch import, no CUDA context)"""
    return bool(shutil.which("nvidia-smi")) or Path("/dev/nvidiactl").exists()


@lru_cache(maxsize=1)
def torch_cuda_available() -> bool:
    if not cuda_present():
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch must not take the tools down
        return False


@lru_cache(maxsize=1)
def gpu_arch() -> str | None:
    """sm_XY of GPU 0, or None without a usable GPU. nvidia-smi first (no CUDA context), then torch."""
    smi = shutil.which("nvidia-smi")
    if smi:
        out = _run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
        m = re.match(r"\s*(\d+)\.(\d+)", out or "")
        if m:
            return f"sm_{m.group(1)}{m.group(2)}"
    if torch_cuda_available():
        import torch
        major, minor = torch.cuda.get_device_capability(0)
        return f"sm_{major}{minor}"
    return None


# The architectures nvcc has an arch-specific target for (CUDA 12.0+: sm_90a; 12.8+: the Blackwell ones): the
# instructions the generic target refuses live there (Hopper's wgmma, TMA multicast, setmaxnreg: "not supported on
# .target 'sm_90'"); a model that writes FlashAttention-3-style code needs it (issue 63). Its code runs on that
# architecture only, which is the one a build here is for (the GPU's own).
ARCH_SPECIFIC = frozenset({"sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121"})


def resolve_arch(task) -> str:
    """The GPU's architecture (else the task's, else sm_90), as its arch-specific target where it has one and the
    task does not ask for the generic one (build.arch_specific = false)."""
    arch = gpu_arch() or task.spec.build.arch or DEFAULT_ARCH
    return arch + "a" if arch in ARCH_SPECIFIC and task.spec.build.arch_specific else arch


def arch_flags(arch: str) -> list[str]:
    """nvcc's flags for `arch`. An arch-specific target as one -gencode (cubin only): nvcc 13's `-arch=sm_90a` also
    embeds compute_90 PTX, which ptxas refuses for the very instructions the target is for."""
    if arch.endswith("a"):
        num = arch.removeprefix("sm_")[:-1]
        return [f"-gencode=arch=compute_{num}a,code=sm_{num}a"]
    return [f"-arch={arch}"]


def task_limits(task) -> DeviceLimits | None:
    """The limits a task's launches are checked against: the device's for a CUDA task (the GPU's own,
    else the table's for the task's arch), None for a CPU task (no launch geometry)."""
    return task.backend.limits(task.spec.build.arch)


def table_limits(arch: str | None) -> DeviceLimits:
    arch = arch or DEFAULT_ARCH
    base = arch.rstrip("a")  # sm_90a has sm_90's limits
    row = _TABLE.get(base)
    if row is None:
        row = _TABLE[DEFAULT_ARCH]
        name = f"unknown {arch} (table values of {DEFAULT_ARCH} {row['name']})"
    else:
        name = f"{row['name']} (table value for {arch}, not read from a device)"
    return DeviceLimits(name=name, arch=arch, sm_count=row["sm_count"],
                        max_smem_per_block_optin=row["max_smem_per_block_optin"], source="table")


def device_limits(arch: str | None = None) -> DeviceLimits:
    """The GPU's own limits when torch sees one, else the table row for `arch` (default sm_90)."""
    if torch_cuda_available():
        import torch
        p = torch.cuda.get_device_properties(0)
        dev_arch = f"sm_{p.major}{p.minor}"
        table = table_limits(dev_arch)
        regs = int(getattr(p, "regs_per_multiprocessor", 0) or table.regs_per_sm)
        optin = int(getattr(p, "shared_memory_per_block_optin", 0) or table.max_smem_per_block_optin)
        return DeviceLimits(name=p.name, arch=dev_arch, sm_count=p.multi_processor_count,
                            max_threads_per_block=int(getattr(p, "max_threads_per_block", 1024) or 1024),
                            max_smem_per_block_optin=optin, regs_per_sm=regs,
                            regs_per_block=min(regs, table.regs_per_block), source="device")
    return table_limits(arch)


# --- environment probes for `agent doctor` -----------------------------------------------------
class ToolInfo(BaseModel):
    found: bool
    path: str | None = None
    version: str | None = None
    detail: str = ""


def _run(argv: list[str], timeout: float = 20) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout + out.stderr if out.returncode == 0 else None


def nvcc_info() -> ToolInfo:
    path = find_nvcc()
    if not path:
        return ToolInfo(found=False)
    out = _run([path, "--version"]) or ""
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return ToolInfo(found=True, path=path, version=m.group(2) if m else None)


def ncu_info() -> ToolInfo:
    path = find_ncu()
    if not path:
        return ToolInfo(found=False)
    out = _run([path, "--version"]) or ""
    m = re.search(r"Version\s+([\d.]+)", out)
    return ToolInfo(found=True, path=path, version=m.group(1) if m else None)


def ncu_report_info(ncu_path: str | None) -> ToolInfo:
    """Is `ncu_report` importable: installed (PyPI ncu-report) or from the Nsight Compute install?"""
    code = "import ncu_report, sys; print(getattr(ncu_report, '__file__', '?'))"
    out = _run([sys.executable, "-c", code])
    if out:
        return ToolInfo(found=True, path=out.strip().splitlines()[-1], detail="importable")
    for d in ncu_python_dirs(ncu_path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(d), os.environ.get("PYTHONPATH")]))}
        try:
            res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode == 0:
            return ToolInfo(found=True, path=str(d), detail="importable from the Nsight Compute install")
    return ToolInfo(found=False)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (the variable's own entries where it is set,
    else nvidia-smi's indices), without a CUDA context: one dask worker each (agent/evaluation/executor.py)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "--query-gpu=index", "--format=csv,noheader"]) if smi else None
    return [ln.strip() for ln in (out or "").splitlines() if ln.strip().isdigit()]


def gpu_processes() -> set[int] | None:
    """The pids nvidia-smi lists as holding a CUDA context (`--query-compute-apps`), or None where it cannot say (no
    nvidia-smi, or it failed). A process that has ended is still listed while another process holds its context
    (a child it forked keeps its device files open)."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "--query-compute-apps=pid", "--format=csv,noheader"]) if smi else None
    return None if out is None else compute_pids(out)


def compute_pids(text: str) -> set[int]:
    """The pids of nvidia-smi's `--query-compute-apps=pid` lines (a line that is not a number is skipped)."""
    return {int(ln.split(",")[0]) for ln in text.splitlines() if ln.split(",")[0].strip().isdigit()}


def context_outlived(pid: int, wait_s: float) -> float | None:
    """For a process that has ended and been reaped: the seconds its CUDA context stayed on the GPU after, where that
    was more than `wait_s` (still listed at the end of the wait); None where it went (normally at once: the driver
    tears a context down as its process exits) or nvidia-smi cannot say."""
    import time
    t0 = time.monotonic()
    while True:
        pids = gpu_processes()
        if pids is None or pid not in pids:
            return None
        if time.monotonic() - t0 >= wait_s:
            return time.monotonic() - t0
        time.sleep(0.2)


def driver_info() -> ToolInfo:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ToolInfo(found=False)
    out = _run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"])
    if not out:
        return ToolInfo(found=False, path=smi, detail="nvidia-smi failed (driver not loaded?)")
    first = out.strip().splitlines()[0]
    version, _, name = (s.strip() for s in first.partition(","))
    return ToolInfo(found=True, path=smi, version=version, detail=name)


class CounterProbe(BaseModel):
    status: str            # ok | no_permission | no_gpu | ncu_missing | error
    message: str = ""


_PROBE = "import torch; x = torch.ones(1024, device='cuda'); y = x * 2; torch.cuda.synchronize(); print(float(y.sum()))"


def ncu_counter_probe(timeout_s: float = 120) -> CounterProbe:
    """Run ncu for one metric on one tiny torch kernel. Slow (seconds): only when asked."""
    ncu = find_ncu()
    if not ncu:
        return CounterProbe(status="ncu_missing", message="ncu not found")
    if not torch_cuda_available():
        return CounterProbe(status="no_gpu", message="no CUDA GPU visible to torch")
    from tools.isolation.sandbox import run_isolated
    with tempfile.TemporaryDirectory() as tmp:
        res = run_isolated([ncu, "--metrics", "sm__cycles_elapsed.avg", "--launch-count", "1", "--target-processes",
                            "all", sys.executable, "-c", _PROBE], timeout_s, cwd=tmp)
    text = res.stdout + res.stderr
    if "ERR_NVGPUCTRPERM" in text:
        return CounterProbe(status="no_permission", message=(
            "ERR_NVGPUCTRPERM: this user may not read GPU counters; run as root, or set "
            "`options nvidia NVreg_RestrictProfilingToAdminUsers=0` (modprobe.d) and reload the driver"))
    if res.status.value == "ok" and "sm__cycles_elapsed.avg" in text:
        return CounterProbe(status="ok", message="ncu read a hardware counter")
    tail = "\n".join(ln for ln in text.strip().splitlines()[-3:])
    return CounterProbe(status="error", message=f"ncu probe {res.reason() if res.status.value != 'ok' else 'gave no metric'}: {tail}")


class BlockingStreams:
    """`with BlockingStreams(n) as streams:` n CUDA streams made with cuStreamCreate's default flags, as torch
    ExternalStreams. torch's own streams are non-blocking: work a kernel puts on the legacy default stream (a
    `<<<grid, block>>>` launch without a stream, what KernelBench's solutions write) then runs beside the caller's
    stream instead of before its next work, and a caller on such a stream reads the output before it is written. A
    blocking stream keeps the legacy stream's ordering, which is what such a kernel was written for (its callers
    are on the default stream); two blocking streams still run side by side. Made on the calling thread, which must
    have torch's CUDA context current (any torch CUDA call made there); destroyed after a device-wide synchronize."""

    def __init__(self, n: int):
        self.n, self.handles = n, []

    def __enter__(self) -> list:
        import ctypes

        import torch
        torch.cuda.current_stream().synchronize()        # torch's context current on this thread
        cu = ctypes.CDLL("libcuda.so.1")
        for _ in range(self.n):
            h = ctypes.c_void_p()
            rc = cu.cuStreamCreate(ctypes.byref(h), ctypes.c_uint(0))
            if rc != 0:
                self.__exit__()
                raise RuntimeError(f"cuStreamCreate failed with CUresult {rc}")
            self.handles.append(h)
        return [torch.cuda.ExternalStream(h.value) for h in self.handles]

    def __exit__(self, *exc) -> None:
        import ctypes

        import torch
        if self.handles:
            torch.cuda.synchronize()
            cu = ctypes.CDLL("libcuda.so.1")
            for h in self.handles:
                cu.cuStreamDestroy_v2(h)
            self.handles = []

"""A floor on how fast a kernel can possibly be: the roofline of the task's FLOP and byte formulas.

    floor = max(flops / peak_flops, bytes / peak_bandwidth) / MARGIN

A measured time below the floor is not a fast kernel, it is a kernel that did not do the work while
it was timed (a result memoized across timed calls, an early return in a timing loop, work on a
stream the events do not see). Bench marks such a result `suspicious`, naming the floor.

The peaks are deliberately generous, so an honest kernel is never flagged:
- CUDA, from a table by GPU name (dense, no sparsity): H100/H200 fp16/bf16 tensor 990 TFLOP/s,
  tf32 495, fp32 67 (an fp32 task is bounded by the tf32 tensor peak: 3xTF32 emulation is a legal
  way to meet fp32 tolerances); HBM 3.35 TB/s (H100 SXM) and 4.8 TB/s (H200). MARGIN 2 on top (a
  write can still sit in L2 when the event fires). An unknown GPU gets peaks above any GPU made.
- CPU: 200 GFLOP/s and 200 GB/s per core the process may run on (os.sched_getaffinity). One core
  of a 2025 server does at most ~100 fp32 GFLOP/s with AVX-512 FMA and ~400 GB/s from L1, so a
  single-core-at-peak bound per core is far above what a kernel sustains. MARGIN 1.
No formulas in task.toml: no floor (None).
"""

from __future__ import annotations

import os

from pydantic import BaseModel

# name fragment (lower case) -> (tensor fp16/bf16 TFLOP/s, tf32 TFLOP/s, fp32 TFLOP/s, HBM TB/s)
GPU_PEAKS: dict[str, tuple[float, float, float, float]] = {
    "h200": (990.0, 495.0, 67.0, 4.8),
    "h100": (990.0, 495.0, 67.0, 3.35),
    "gh200": (990.0, 495.0, 67.0, 4.9),
    "a100": (312.0, 156.0, 19.5, 2.04),
    "l40s": (366.0, 183.0, 91.6, 0.864),
    "b200": (2250.0, 1100.0, 80.0, 8.0),
}
UNKNOWN_GPU = (5000.0, 2500.0, 200.0, 20.0)   # above any GPU made: an unknown GPU is never wrongly flagged
CUDA_MARGIN = 2.0
CPU_GFLOPS_PER_CORE = 200.0
CPU_GBPS_PER_CORE = 200.0
CPU_MARGIN = 1.0


class Floor(BaseModel):
    ms: float                  # no honest kernel can be faster than this
    basis: str                 # which bound, with the numbers behind it

    def describe(self) -> str:
        return f"roofline floor {self.ms * 1e3:.3g} us ({self.basis})"


def cpu_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def peaks(device: str, dtype: str, cores: int | None = None) -> tuple[float, float, float, str]:
    """(FLOP/s, bytes/s, margin, label) for a device as bench names it ('cpu' or 'cuda: NAME')."""
    if device.startswith("cuda"):
        key = gpu_key(device)
        fp16, tf32, fp32, hbm = GPU_PEAKS[key] if key else UNKNOWN_GPU
        flops = fp16 if dtype in ("float16", "bfloat16") else tf32 if dtype == "float32" else max(fp32, tf32)
        label = f"{key.upper() if key else 'unknown GPU'}: {flops:g} TFLOP/s {dtype}, {hbm:g} TB/s"
        return flops * 1e12, hbm * 1e12, CUDA_MARGIN, label
    n = cores or cpu_cores()
    label = f"CPU, {n} core(s) x {CPU_GFLOPS_PER_CORE:g} GFLOP/s, {CPU_GBPS_PER_CORE:g} GB/s"
    return n * CPU_GFLOPS_PER_CORE * 1e9, n * CPU_GBPS_PER_CORE * 1e9, CPU_MARGIN, label


def gpu_key(device: str) -> str | None:
    """GPU_PEAKS' key for a device as bench names it ('cuda: NVIDIA H200'): the longest name fragment
    it contains (gh200 before h200); None for a CPU or a GPU the table does not name."""
    if not device.startswith("cuda"):
        return None
    name = device.split(":", 1)[-1].strip().lower()
    return next((k for k in sorted(GPU_PEAKS, key=len, reverse=True) if k in name), None)


def spec_peak(device: str, dtype: str) -> tuple[float, float, str] | None:
    """(TFLOP/s, GB/s, label): the spec-sheet peaks of a GPU in GPU_PEAKS for "% of peak" beside a
    time; fp16/bf16 against the tensor-core peak, anything else against the fp32 (non-tensor) peak. None
    for a CPU or a GPU not in the table: no figure is better than a made-up one."""
    key = gpu_key(device)
    if key is None:
        return None
    fp16, _tf32, fp32, hbm = GPU_PEAKS[key]
    half = dtype in ("float16", "bfloat16")
    return (fp16 if half else fp32), hbm * 1e3, f"{key.upper()}, {dtype} {'tensor' if half else 'non-tensor'}"


def floor_ms(flops: float | None, nbytes: float | None, device: str, dtype: str,
             cores: int | None = None) -> Floor | None:
    """The fastest time an honest kernel could reach; None where the task has no formulas."""
    if not flops and not nbytes:
        return None
    pf, pb, margin, label = peaks(device, dtype, cores)
    t_f = (flops or 0.0) / pf
    t_b = (nbytes or 0.0) / pb
    bound = "compute" if t_f >= t_b else "memory"
    return Floor(ms=max(t_f, t_b) / margin * 1e3,
                 basis=f"{bound} bound: {flops or 0:.3g} FLOP, {nbytes or 0:.3g} B at {label}"
                       + (f", margin {margin:g}x" if margin != 1 else ""))

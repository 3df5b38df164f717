"""The environment fingerprint written into run.json: what a number was measured on.

The toolchain probes are the doctor's (tools/backends/device.py), so a run records what `agent doctor` shows."""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
from importlib import metadata

from agent.records.schema import EnvFingerprint
from tools.backends.device import driver_info, ncu_info, nvcc_info, torch_cuda_available


def first_line(argv: list[str]) -> str | None:
    """The first line a tool prints (stdout, else stderr), or None where it is missing or fails to run."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def fingerprint(repo=None) -> EnvFingerprint:
    fp = EnvFingerprint(host=socket.gethostname(), python=platform.python_version())
    nvcc, ncu, drv = nvcc_info(), ncu_info(), driver_info()
    fp.nvcc = f"nvcc {nvcc.version}" if nvcc.found else None
    fp.ncu = f"ncu {ncu.version}" if ncu.found else None
    fp.driver = drv.version if drv.found else None
    fp.cxx = first_line(["c++", "--version"])
    # torch's version from its metadata: importing torch costs the agent 1.5 s of CPU, and on a machine
    # without a GPU driver nothing else of torch is asked for here (torch_cuda_available does not import it)
    try:
        fp.torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pass
    try:
        if torch_cuda_available():
            import torch
            p = torch.cuda.get_device_properties(0)
            fp.gpu, fp.sm_count, fp.cuda_runtime = p.name, p.multi_processor_count, torch.version.cuda
    except Exception:   # a broken torch install must not stop the fingerprint
        pass
    if drv.found:
        clocks = gpu_clocks()
        if clocks:
            fp.clocks = f"SM {clocks} (current, max) at start; clocks left as found (ncu --clock-control none)"
    if repo is not None:
        fp.git_sha = repo.head.commit.hexsha
        fp.git_dirty = repo.is_dirty(untracked_files=False)
    return fp


def gpu_clocks() -> str | None:
    """GPU 0's SM clock now and its maximum, as nvidia-smi prints them ("1980 MHz, 1980 MHz"), or None."""
    return first_line(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm", "--format=csv,noheader"])

"""The environment fingerprint written into run.json: what a number was measured on."""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess

from agent.runlog import EnvFingerprint


def _cmd(argv: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = (out.stdout or out.stderr).strip()
    return text or None


def fingerprint(repo=None) -> EnvFingerprint:
    fp = EnvFingerprint(host=socket.gethostname(), python=platform.python_version())
    nvcc = _cmd(["nvcc", "--version"])
    fp.nvcc = nvcc.splitlines()[-1] if nvcc else None
    cxx = _cmd(["c++", "--version"])
    fp.cxx = cxx.splitlines()[0] if cxx else None
    ncu = _cmd(["ncu", "--version"])
    fp.ncu = ncu.splitlines()[-1] if ncu else None
    try:
        import torch
        fp.torch = torch.__version__
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            fp.gpu, fp.sm_count, fp.cuda_runtime = p.name, p.multi_processor_count, torch.version.cuda
    except Exception:   # a broken torch install must not stop the fingerprint
        pass
    smi = _cmd(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm", "--format=csv,noheader"])
    if smi:
        parts = [p.strip() for p in smi.splitlines()[0].split(",")]
        fp.driver = parts[0]
        if len(parts) >= 3:
            fp.clocks = f"SM {parts[1]} (max {parts[2]}) at start; clocks left as found (ncu --clock-control none)"
    if repo is not None:
        fp.git_sha = repo.head.commit.hexsha
        fp.git_dirty = repo.is_dirty(untracked_files=False)
    return fp

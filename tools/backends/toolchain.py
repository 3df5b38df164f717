"""Where the tools are: ninja, the C++ compiler, nvcc and its CUDA install, ncu and the ncu_report
module of its install. The bottom of tools/: it imports nothing of this project, so that the build,
the device probe, the profiler and the doctor can all ask it without importing each other."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path


def find_ninja() -> str | None:
    found = shutil.which("ninja")
    if found:
        return found
    try:  # the `ninja` PyPI package ships the binary
        import ninja  # type: ignore[import-untyped]
        cand = Path(ninja.BIN_DIR) / "ninja"
        return str(cand) if cand.is_file() else None
    except ImportError:
        return None


def find_cxx() -> str | None:
    env = os.environ.get("CXX")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@lru_cache(maxsize=None)
def takes_flag(cxx: str, flag: str) -> bool:
    """Whether the C++ compiler `cxx` accepts `flag` (gcc and clang refuse an option they do not know, even when
    only preprocessing an empty file); asked once per compiler and flag in a process."""
    try:
        return subprocess.run([cxx, flag, "-E", "-x", "c++", "-"], input=b"", capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME / $CUDA_PATH. Resolves wrapper scripts to the real install."""
    found = shutil.which("nvcc")
    if not found:
        for var in ("CUDA_HOME", "CUDA_PATH"):
            base = os.environ.get(var)
            if base and (Path(base) / "bin" / "nvcc").is_file():
                found = str(Path(base) / "bin" / "nvcc")
                break
    return found


def cuda_home(nvcc: str | None) -> Path | None:
    """The CUDA install that nvcc belongs to (nvcc may be a wrapper script outside it)."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
    cands.append("/usr/local/cuda")
    for c in cands:
        if c and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return Path(c).resolve()
    return None


def toolchain_hint(tool: str) -> str:
    return {
        "ninja": "ninja not found: `pip install ninja` (or apt-get install ninja-build)",
        "c++": "no C++ compiler (c++/g++/clang++) on PATH: apt-get install g++ (or set CXX)",
        "nvcc": ("nvcc not found on PATH or under $CUDA_HOME: install the CUDA toolkit "
                 "(https://developer.nvidia.com/cuda-downloads) and `export PATH=/usr/local/cuda/bin:$PATH`"),
    }[tool]


def find_ncu() -> str | None:
    """$NCU, else ncu on PATH, else the usual install places. The doctor and the profiler both use this."""
    found = os.environ.get("NCU") or shutil.which("ncu")
    if found:
        return found
    cands = []
    for base in filter(None, [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]):
        cands.append(str(Path(base) / "bin" / "ncu"))
    cands += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    cands += sorted(glob.glob("/usr/local/cuda*/nsight-compute*/ncu"), reverse=True)
    return next((c for c in cands if Path(c).is_file()), None)


def ncu_python_dirs(ncu: str | None = None) -> list[Path]:
    """extras/python folders of the Nsight Compute install that `ncu` belongs to."""
    exe = ncu or find_ncu()
    if not exe:
        return []
    real = Path(exe).resolve()
    cands = [real.parent / "extras" / "python"]
    # /usr/local/cuda/bin/ncu is a wrapper: the install is ../nsight-compute-<ver>/
    for base in (real.parent.parent, real.parent):
        cands += sorted(base.glob("nsight-compute*/extras/python"), reverse=True)
    # a wrapper script names the install it runs (e.g. /opt/nvidia/nsight-compute/2025.3.1/ncu)
    try:
        head = real.read_bytes()[:4096].decode("utf-8", "replace") if real.stat().st_size < 65536 else ""
    except OSError:
        head = ""
    for m in re.finditer(r"(/[\w./-]*nsight-compute[\w./-]*)", head):
        p = Path(m.group(1))
        for d in (p, *p.parents):
            if "nsight-compute" in d.name:
                cands.append(d / "extras" / "python")
                break
    cands += sorted(Path("/opt/nvidia/nsight-compute").glob("*/extras/python"), reverse=True)
    return [c for c in cands if (c / "ncu_report.py").is_file()]


def demangle(names: list[str], nvcc: str | None = None) -> dict[str, str]:
    """Mangled -> readable, with cu++filt (ships with CUDA) or c++filt; the mangled name if neither works."""
    if not names:
        return {}
    tools = []
    home = cuda_home(nvcc) if nvcc else None
    if home:
        tools.append(str(home / "bin" / "cu++filt"))
    tools += [t for t in (shutil.which("cu++filt"), shutil.which("c++filt")) if t]
    for tool in tools:
        if not Path(tool).is_file():
            continue
        try:
            out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        got = out.stdout.splitlines()
        if out.returncode == 0 and len(got) == len(names):
            return dict(zip(names, got))
    return {n: n for n in names}

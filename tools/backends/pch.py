"""A precompiled torch/extension.h for a torch extension's editable C++ file.

A user's extension in one file (`#include <torch/extension.h>`, the kernel and PYBIND11_MODULE, the form
`torch.utils.cpp_extension.load` takes) is the file the agent edits, so every candidate compiles torch's
headers again: 22 s on a 2-core machine, of which gcc's reading of the headers is half (BENCHMARKS.md).
gcc can load that half from a precompiled header instead, as torch's own `load_inline(use_pch=True)`
does (which writes it into torch's install; this one goes to a cache of its own).

- Which files: an editable .cpp/.cc/.cxx of a torch extension whose first line of code is
  `#include <torch/extension.h>` (comments, blank lines and `#pragma once` before it are fine), and
  such a file that is not editable (a split extension's binding, compiled once per task and then
  linked by later builds, tools.build.reuse) where the cache already holds the header: never made for one. gcc can
  only use a precompiled header included before any other code, and the build does not force the
  include to the top (`-include`): that would change what a file that defines macros first means.
- How: the header is compiled once per compiler, flags and torch install into
  $AGENT_CACHE/pch/KEY/torch/extension.h.gch (AGENT_CACHE default: $XDG_CACHE_HOME/kernel-agent, else
  ~/.cache/kernel-agent), about 0.76 GB and 35 s on a 2-core machine, under a lock so that a sweep's
  parallel builds make it once. The compile of such a file gets `-I that/folder -Winvalid-pch`: gcc looks
  for torch/extension.h.gch in each include folder before torch/extension.h, uses it where its flags
  match, and otherwise warns and reads the headers as before (the build is never wrong for it, only
  slower). Beside the .gch a two-line torch/extension.h hands a second include of the header (or a
  compile that cannot use the .gch) over to the real one (`_stub`).
- Not for .cu files: nvcc hands its host compiler a file it has already preprocessed, and cicc and
  cudafe++ read no gcc precompiled header (scripts/rebuild_phases.py shows the 42 s of the seeds' form
  go to those three front ends). Not for clang (its precompiled headers take other flags).
- AGENT_PCH=0 turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HEADER = "torch/extension.h"
CXX_SOURCES = {".cpp", ".cc", ".cxx"}
FREE_BYTES_NEEDED = 2 * 1024**3     # the header is about 0.76 GB; leave room for the build around it

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_FIRST = re.compile(r"#\s*include\s*<torch/extension\.h>\s*$")
_PRAGMA_ONCE = re.compile(r"#\s*pragma\s+once\s*$")


def strip_comments(text: str) -> str:
    """C/C++ source without its comments, each replaced by a space and the line breaks it held (so that
    line numbers and token boundaries stay)."""
    return _COMMENTS.sub(lambda m: " " + "\n" * m.group(0).count("\n"), text)


def first_code_is_torch_extension(text: str) -> bool:
    """True when the file's first line of code is `#include <torch/extension.h>`."""
    for line in strip_comments(text).splitlines():
        line = line.strip()
        if not line or _PRAGMA_ONCE.match(line):
            continue
        return bool(_FIRST.match(line))
    return False


_QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def quoted_includes(rel: str, text: str) -> list[str]:
    """The files the source `rel` includes with `#include "..."`, as paths of the task (beside `rel`)."""
    here = Path(rel).parent
    return [(here / inc).as_posix() for inc in _QUOTED.findall(strip_comments(text))]


def includes_editable(task, rel: str, text: str) -> bool:
    """True when the source `rel` includes (`#include "..."`, beside it) a file the agent edits: it is compiled again
    for every candidate, as an editable file is (an imported KernelBench task's binding.cpp, which includes
    kernel.cpp as load_inline's main.cpp holds the solution's cpp_sources)."""
    return any(f in task.spec.editable for f in quoted_includes(rel, text))


def included_sources(task, src_dir: Path) -> set[str]:
    """The task's sources that another of its sources includes (`#include "kernel.cpp"`): part of that file's
    translation unit, not one of their own (compiled apart too, their definitions would be linked twice)."""
    out: set[str] = set()
    for rel in task.spec.sources:
        p = Path(src_dir) / rel
        if Path(rel).suffix in CXX_SOURCES | {".cu"} and p.is_file():
            out.update(f for f in quoted_includes(rel, p.read_text(errors="replace")) if f in task.spec.sources and f != rel)
    return out


def pch_sources(task, src_dir: Path, editable: bool = True, inside: set[str] | None = None) -> list[str]:
    """The task's C++ sources compiled for every candidate (editable, or including an editable file) that a
    precompiled torch/extension.h would speed up (`editable` False: its other such sources, a split extension's
    binding, which take one only if it is cached). `inside`: included_sources, where the caller has it."""
    if task.spec.form != "torch_extension":
        return []
    out, inside = [], included_sources(task, src_dir) if inside is None else inside
    for rel in task.spec.sources:
        p = Path(src_dir) / rel
        if Path(rel).suffix not in CXX_SOURCES or not p.is_file() or rel in inside:
            continue
        text = p.read_text(errors="replace")
        if (rel in task.spec.editable or includes_editable(task, rel, text)) == editable \
                and first_code_is_torch_extension(text):
            out.append(rel)
    return out


@dataclass
class Pch:
    include_dir: Path | None      # where torch/extension.h.gch is: -I this; None: compile without one
    note: str                     # for the build log and `agent check`: built (seconds, size), cached, or why not


def cache_root() -> Path:
    if os.environ.get("AGENT_CACHE"):
        return Path(os.environ["AGENT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "kernel-agent"


@lru_cache(maxsize=8)
def compiler_id(cxx: str) -> str:
    """`cxx --version`, cached: what a cache key of a compiler's output names (here and tools/measure/cpu_peak.py)."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def _torch_header(flags: list[str]) -> Path | None:
    dirs = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f in ("-isystem", "-I")]
    dirs += [f[2:] for f in flags if f.startswith("-I") and len(f) > 2]
    return next((Path(d) / HEADER for d in dirs if (Path(d) / HEADER).is_file()), None)


def pch_flags(cxx_flags: list[str], src_dir: Path) -> list[str]:
    """The compile's flags that matter to the header: not the task's folder, not the module's name
    (used by PYBIND11_MODULE in the user's file only), so that every extension built with the same
    compiler and flags shares one precompiled header."""
    return [f for f in cxx_flags if f != f"-I{src_dir}" and not f.startswith("-DTORCH_EXTENSION_NAME=")]


def _stub(gch: Path) -> bool:
    """The header beside the .gch: gcc names the header it loaded from a .gch by the path the .gch was
    found at, so a second `#include <torch/extension.h>` (a header of the user's that includes it again,
    or the forced include of tools.backends.torch_library before the file's own) opens that path, and needs a file
    there; this one hands over to the real header (#include_next), which #pragma once then skips. It is
    also what a compile that cannot use the .gch (-Winvalid-pch) reads."""
    path = gch.with_suffix("")
    text = "#pragma once\n#include_next <torch/extension.h>\n"
    try:
        if not (path.is_file() and path.read_text() == text):
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
    except OSError:
        return False
    return True


def ensure(cxx: str, flags: list[str], timeout_s: float, make: bool = True) -> Pch:
    """The precompiled header for these flags: from the cache, or built now (once, under a lock).
    `make` False: from the cache only (a file compiled once per task, a binding, is not worth 35 s and
    0.76 GB, but takes one an editable file of any task made: 13 s instead of 24 on 2 cores)."""
    from tools.isolation.sandbox import ProcStatus, run_isolated
    if os.environ.get("AGENT_PCH") == "0":
        return Pch(None, "off (AGENT_PCH=0)")
    ident = compiler_id(cxx)
    if "Free Software Foundation" not in ident:
        return Pch(None, f"{Path(cxx).name} is not gcc: no precompiled header")
    header = _torch_header(flags)
    if header is None:
        return Pch(None, f"no {HEADER} among the include folders")
    key_src = [str(Path(cxx).resolve()), ident, flags, str(header.resolve()), header.stat().st_mtime_ns,
               (header.parent / "version.h").stat().st_mtime_ns if (header.parent / "version.h").is_file() else 0]
    key = hashlib.sha256(json.dumps(key_src).encode()).hexdigest()[:16]
    folder = cache_root() / "pch" / key
    gch = folder / "torch" / "extension.h.gch"
    if gch.is_file() and _stub(gch):
        return Pch(folder, f"precompiled {HEADER} from {folder}")
    if not make:
        return Pch(None, f"no precompiled {HEADER} cached for these flags (only an editable file makes one)")
    try:
        gch.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(gch.parent).free
    except OSError as e:
        return Pch(None, f"no precompiled header: cannot write {folder} ({e.strerror or e})")
    if free < FREE_BYTES_NEEDED:
        return Pch(None, f"no precompiled header: {free / 1e9:.1f} GB free under {folder}, it needs about 0.8 GB "
                         "and room around it (set AGENT_CACHE to a roomier place, or AGENT_PCH=0)")
    deadline = time.monotonic() + timeout_s
    with open(folder / ".lock", "w") as lock:
        while True:                     # another build (a sweep's parallel jobs) may be making it now
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return Pch(None, f"no precompiled header: {folder} was locked by another build for {timeout_s:.0f}s")
                time.sleep(0.5)
        if gch.is_file() and _stub(gch):
            return Pch(folder, f"precompiled {HEADER} from {folder} (made by another build meanwhile)")
        tmp = gch.with_name(f".{gch.name}.{os.getpid()}")
        t0 = time.monotonic()
        proc = run_isolated([cxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp)],
                            max(1.0, deadline - time.monotonic()))
        if proc.status != ProcStatus.ok or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            err = next((ln for ln in (proc.stderr or "").splitlines() if "error" in ln), proc.reason())
            return Pch(None, f"no precompiled header: compiling {HEADER} failed: {err.strip()[:300]}")
        size = tmp.stat().st_size
        os.replace(tmp, gch)
        if not _stub(gch):
            return Pch(None, f"no precompiled header: cannot write {gch.with_suffix('')}")
        return Pch(folder, f"precompiled {HEADER} into {folder} in {time.monotonic() - t0:.1f}s "
                           f"({size / 1e9:.2f} GB, once for these flags)")

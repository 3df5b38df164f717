"""The editable sources as the compiler compiles them (issue 65): the preprocessor's output, the user's lines picked
out by its line markers, for the scan (tools/build/scan.py) to read what is compiled and not only what is written.

A scan of the written text misses what the preprocessor builds: `#define KEEP static` then `KEEP float cache[64];`, a
name pasted from parts (`CAT(fo, pen)`), `_Pragma("omp parallel")` inside a macro. Each compile command of the
task's build (write_ninja's, the task's own compiler and flags) is run with -E instead of -c:

- a C++ source: the command with `-E`;
- a CUDA source: nvcc's own preprocessing commands, read from `nvcc --dryrun` (nvcc runs the host compiler's
  preprocessor twice: once for the host code, once for the device code with __CUDA_ARCH__ defined), each run with its
  output in a folder of ours. Both passes are kept: code under `#ifdef __CUDA_ARCH__` is in one of them only.

Only the lines whose line markers name an editable file are kept (the headers' own lines are the libraries'), each
with the line of the user's file it came from, so a hit quotes the line the user wrote. CUDA's keywords come out of
the device pass as attributes (`__device__` is `__attribute__((device))`); they are written back as keywords.

A source the preprocessor refuses gives no lines here and a reason; the build then says why (the written text was
scanned either way). Not expanded yet, said the same way: a source that includes torch's headers (their -E reads
about 430,000 lines, 3-9 s on 2 cores beside a build that has the precompiled header: CI's 120 s build limit was
reached) and a one-file CUDA extension's halves (tools/backends/cu_split.py).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.backends.cu_scan import TORCH_INCLUDE
from tools.task import Task

_MARKER = re.compile(r'^#\s*(?:line\s+)?(\d+)\s+"((?:\\.|[^"\\])*)"')
# CUDA's execution and memory space keywords as the device pass writes them (host_defines.h: __annotate__)
_SPACE = re.compile(r"__attribute__\s*\(\(\s*(device|host|global|managed|shared|constant)\s*\)\)")
TIMEOUT_S = 60.0


@dataclass
class Expanded:
    lines: list[tuple[str, int, str]] = field(default_factory=list)   # (editable file, its line, the line compiled)
    passes: list[str] = field(default_factory=list)                   # "c++ a.cpp", "host a.cu", "device a.cu"
    failed: list[str] = field(default_factory=list)                   # a preprocessing that could not run, and why
    seconds: float = 0.0


def _commands(task: Task, src_dir: Path) -> list[tuple[str, list[str]]]:
    """(editable source, its compile argv) for each editable source the build compiles by itself."""
    from tools.build.build import find_tools
    from tools.build.commands import build_commands
    tools, _ = find_tools(task)
    by_name = {Path(p).name: p for p in (tools["c++"], tools.get("nvcc")) if p}
    out = []
    for cmd in build_commands(task, src_dir):
        argv = shlex.split(cmd.split("   # ", 1)[0])
        if "-c" in argv and argv[0] in by_name and argv[argv.index("-c") + 1] in task.spec.editable:
            out.append((argv[argv.index("-c") + 1], [by_name[argv[0]], *argv[1:]]))
    return out


def _preprocess_argv(rel: str, argv: list[str], tmp: Path, cwd: Path) -> list[tuple[str, list[str]]] | str:
    """The preprocessing commands of one compile: [(pass name, argv writing its output into tmp)], or why not."""
    if Path(argv[0]).name.startswith("nvcc"):
        env = {**os.environ, "TMPDIR": str(tmp)}
        try:
            dry = subprocess.run([*argv, "--dryrun"], cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"nvcc --dryrun: {e}"
        steps = [shlex.split(ln[3:]) for ln in dry.stderr.splitlines() if ln.startswith("#$ ") and " -E " in ln]
        out = []
        for n, step in enumerate(steps):
            if "-o" not in step:
                continue
            step[step.index("-o") + 1] = str(tmp / f"{n}.ii")
            out.append(("device" if any(a.startswith("-D__CUDA_ARCH__=") for a in step) else "host", step))
        return out or f"nvcc --dryrun named no preprocessing step (exit {dry.returncode})"
    i = argv.index("-c")
    return [("c++", [*argv[:i], "-E", argv[i + 1], "-o", str(tmp / "0.ii")])]


def _user_lines(text: str, cwd: Path, editable: set[str]) -> list[tuple[str, int, str]]:
    """The preprocessor's output lines that its line markers attribute to an editable file, with their line."""
    out: list[tuple[str, int, str]] = []
    root = cwd.resolve()
    names: dict[str, str | None] = {}
    cur, line = None, 0
    for ln in text.splitlines():
        m = _MARKER.match(ln)
        if m:
            name = m.group(2)
            if name not in names:
                p = Path(name) if os.path.isabs(name) else cwd / name
                try:
                    rel = p.resolve().relative_to(root).as_posix()
                except ValueError:
                    rel = None
                names[name] = rel if rel in editable else None
            cur, line = names[name], int(m.group(1))
            continue
        if cur is not None and ln.strip():
            out.append((cur, line, _SPACE.sub(r"__\1__", ln)))
        line += 1
    return out


def expand(task: Task, src_dir: Path | None = None) -> Expanded:
    """The task's editable sources as compiled (see the module doc), from `src_dir` (default the task's folder)."""
    t0 = time.monotonic()
    src = Path(src_dir or task.root).resolve()
    res = Expanded()
    editable = set(task.spec.editable)
    seen: set[tuple[str, int, str]] = set()
    with tempfile.TemporaryDirectory(prefix="agent-expand-") as d:
        for rel, argv in _commands(task, src):
            if TORCH_INCLUDE.search((src / rel).read_text(errors="replace")):
                res.failed.append(f"{rel}: includes torch's headers, not preprocessed (tools/build/expand.py)")
                continue
            tmp = Path(tempfile.mkdtemp(dir=d))
            steps = _preprocess_argv(rel, argv, tmp, src)
            if isinstance(steps, str):
                res.failed.append(f"{rel}: {steps}")
                continue
            procs = [(name, step, subprocess.Popen(step, cwd=src, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.PIPE, text=True)) for name, step in steps]
            for name, step, proc in procs:       # the host and device passes run side by side
                try:
                    _, err = proc.communicate(timeout=TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    res.failed.append(f"{rel} ({name}): the preprocessor ran past {TIMEOUT_S:g} s")
                    continue
                outp = Path(step[step.index("-o") + 1])
                if proc.returncode != 0 or not outp.is_file():
                    res.failed.append(f"{rel} ({name}): " + (" ".join(err.split())[:200] or f"exit {proc.returncode}"))
                    continue
                res.passes.append(f"{name} {rel}")
                for item in _user_lines(outp.read_text(errors="replace"), src, editable):
                    if item not in seen:
                        seen.add(item)
                        res.lines.append(item)
    res.seconds = time.monotonic() - t0
    return res

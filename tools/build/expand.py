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

A source that includes torch's headers is preprocessed through the build's precompiled torch/extension.h
(tools.backends.pch; gcc's -fpch-preprocess loads it instead of reading torch's 430,000 lines: 0.04 s instead of 1-9 s),
and a one-file CUDA extension as the build compiles it, its two halves (tools.backends.cu_split: the kernels by nvcc,
the torch code by gcc with that header), their #line directives naming the user's file. What a system header's macro
puts on a user's line (TORCH_CHECK's body, PYBIND11_MODULE's statics; the line marker's flag 3) is the header's code:
the parser reads it (whole statements), the rules do not, but for CUDA's space keywords, themselves the CUDA headers'
macros: `__device__` on a user's line is the user's, however the user spelled it.

A one-file extension's torch half that no precompiled header can serve (its first code is not torch/extension.h:
the seeds' attention, whose kernel includes come first) is preprocessed reading torch's headers, 1-9 s beside the
build; each compile's output is kept by what it depends on (_key), so that happens again only when the torch code
changes, as its compile does.

A source the preprocessor refuses gives no lines here and a reason; the build then says why (the written text was
scanned either way). Not preprocessed, said the same way: a file that includes torch's headers and that a precompiled
header could serve, while none is cached (the run's first build makes it); one that none could serve; a .cu that
includes them and is built whole (nvcc's passes would read torch's headers twice beside a 42 s build).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from tools.backends.cu_scan import TORCH_INCLUDE
from tools.task import Task

_MARKER = re.compile(r'^#\s*(?:line\s+)?(\d+)\s+"((?:\\.|[^"\\])*)"((?:\s+\d)*)')
# CUDA's execution and memory space keywords as the device pass writes them (host_defines.h: __annotate__)
_SPACE = re.compile(r"__attribute__\s*\(\(\s*(device|host|global|managed|shared|constant)\s*\)\)")
_KEYWORD = re.compile(r"\b__(?:device|host|global|managed|shared|constant)__\b")
TIMEOUT_S = 60.0


@dataclass
class Expanded:
    lines: list[tuple[str, int, str]] = field(default_factory=list)   # (editable file, its line, the line compiled)
    # each pass's lines (one translation unit each, in order) with what a header's macro put on the user's lines
    # (TORCH_CHECK's body, PYBIND11_MODULE's statics) flagged True: the parser reads whole statements of one unit;
    # the rules read the user's own tokens of all (`lines`: of a header's macro, only the CUDA space keywords it wrote)
    units: list[list[tuple[str, int, str, bool]]] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)                   # "c++ a.cpp", "host a.cu", "device a.cu"
    failed: list[str] = field(default_factory=list)                   # a preprocessing that could not run, and why
    kept: list[str] = field(default_factory=list)                     # passes whose output an earlier one gave (_key)
    seconds: float = 0.0


def _commands(task: Task, src_dir: Path, tmp: Path) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(editable source, a compile argv the build runs for it) for each editable source, as build() compiles it:
    write_ninja's commands with the one-file extension's halves (tools.backends.cu_split, written under `tmp`) and the
    precompiled torch/extension.h where one is cached (tools.backends.pch; gcc then preprocesses with it,
    -fpch-preprocess: torch's 430,000 lines are loaded, not read). And why a source is not preprocessed: one that
    still includes torch's headers with no precompiled header to serve them (the first build of a run makes it; a
    one-file .cu built whole)."""
    from tools.backends.cu_split import prepare as prepare_split
    from tools.backends.device import resolve_arch
    from tools.backends.pch import ensure, includes_editable, pch_flags, pch_sources
    from tools.build.build import cxx_flags_of, find_tools, write_ninja
    tools, need_nvcc = find_tools(task)
    if tools["c++"] is None or (need_nvcc and tools["nvcc"] is None):
        return [], []
    skipped: list[str] = []
    try:
        split, _ = prepare_split(task, src_dir, tmp)
        eased = pch_sources(task, src_dir) + [f"{rel}.host.cpp" for rel, h in split.items() if h.pch]
        got = ensure(tools["c++"], pch_flags(cxx_flags_of(task, src_dir, tools["nvcc"]), src_dir), TIMEOUT_S,
                     make=False) if eased else None
        pch = (got.include_dir, eased) if got is not None and got.include_dir else None
        _, commands = write_ninja(task, tmp, src_dir, tools, resolve_arch(task) if need_nvcc else None,  # type: ignore[arg-type]
                                  None, pch, split)
    except (OSError, ImportError, ValueError) as e:
        return [], [f"the build's commands could not be made: {' '.join(str(e).split())[:200]}"]
    halves = {f"{rel}.kernels.cu": (rel, h.kernels) for rel, h in split.items()}
    halves |= {f"{rel}.host.cpp": (rel, h.host) for rel, h in split.items()}
    by_name = {Path(p).name: p for p in (tools["c++"], tools.get("nvcc")) if p}
    out = []
    for cmd in commands:
        argv = shlex.split(cmd.split("   # ", 1)[0])
        if "-c" not in argv or argv[0] not in by_name:
            continue
        i = argv.index("-c")
        name = argv[i + 1]
        rel, path = halves.get(name, (name, src_dir / name))
        text = Path(path).read_text(errors="replace")
        if rel not in task.spec.editable and not includes_editable(task, rel, text):
            continue                      # (a binding that includes the editable kernel.cpp is read: its lines are)
        if TORCH_INCLUDE.search(text):
            if name in halves and name not in eased:
                pass     # a torch half no precompiled header can serve: torch's headers read (1-9 s) beside the build,
                #          again only for a new torch code (_preprocess), as the build compiles it again only then
            elif not (pch and name in pch[1]):
                half = "its torch half" if name in halves else "it"
                why = ("it is built whole by nvcc, torch's headers and all" if Path(name).suffix == ".cu" else
                       f"no precompiled header serves {half}: {got.note}" if name in eased and got else
                       f"no precompiled header serves {half} (one serves a torch extension's file whose first code is "
                       "#include <torch/extension.h>)")
                skipped.append(f"{rel}: includes torch's headers, not preprocessed (tools/build/expand.py): {why}")
                continue
            else:
                argv, i = [*argv[:i], "-fpch-preprocess", *argv[i:]], i + 1
        out.append((rel, [by_name[argv[0]], *argv[1:i + 1], str(path), *argv[i + 2:]]))
    return out, skipped


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


def _user_lines(text: str, cwd: Path, editable: set[str]) -> list[tuple[str, int, str, bool]]:
    """The preprocessor's output lines that its line markers attribute to an editable file, with their line, and
    whether the text is a system header's macro expanded there (the marker's flag 3: TORCH_CHECK's body, assert's):
    the header's code, not the user's."""
    out: list[tuple[str, int, str, bool]] = []
    root = cwd.resolve()
    names: dict[str, str | None] = {}
    cur, line, system = None, 0, False
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
            cur, line, system = names[name], int(m.group(1)), "3" in m.group(3).split()
            continue
        if cur is not None and ln.strip() and not ln.startswith("#pragma GCC pch_preprocess"):
            out.append((cur, line, _SPACE.sub(r"__\1__", ln), system))
        line += 1
    return out


Unit = list[tuple[str, int, str, bool]]
_CACHE: OrderedDict[str, tuple[list[int], list[str], list[Unit]]] = OrderedDict()
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()          # candidates built on threads of one process share it
_LINE = re.compile(r'(?m)^#line (\d+) ("[^"\n]*")$')


def _key(rel: str, argv: list[str], src: Path, editable: set[str], d: Path) -> tuple[str, list[int]]:
    """What a preprocessing's output depends on within a run, and the numbers of the compiled text's #line directives
    (a half's: lines added to a kernel above the torch code move them and nothing else, _moved): its command (the
    compiled file by its text, those numbers left out, and our folder `d` by a name: a half is written to a new folder
    each time, and the build's flags name it) and the other editable files' texts (what it may include); the rest of
    the task's folder and the toolchain do not change under a run."""
    i = argv.index("-c")
    text = Path(argv[i + 1]).read_text(errors="replace")
    numbers = [int(m.group(1)) for m in _LINE.finditer(text)]
    ours = lambda a: a.replace(str(d.resolve()), "<ours>").replace(str(d), "<ours>")  # noqa: E731  (new each time)
    parts = [*map(ours, argv[:i + 1]), _LINE.sub(r"#line \2", text), *map(ours, argv[i + 2:]), str(src)]
    parts += [f"{f}\0{(src / f).read_text(errors='replace')}" for f in sorted(editable - {rel}) if (src / f).is_file()]
    return hashlib.sha256("\0\0".join(parts).encode()).hexdigest(), numbers


def _moved(units: list[Unit], rel: str, old: list[int], new: list[int]) -> list[Unit]:
    """Kept lines of `rel` with their line numbers moved as the #line directives they came under moved (a half
    holds the user's items in file order: each directive starts a run of the user's lines)."""
    if old == new:
        return units

    def at(n: int) -> int:
        k = max((j for j, o in enumerate(old) if o <= n), default=None)
        return n if k is None else n - old[k] + new[k]
    return [[(f, at(n) if f == rel else n, t, system) for f, n, t, system in unit] for unit in units]


def _preprocess(rel: str, argv: list[str], src: Path, d: Path, editable: set[str]
                ) -> tuple[list[str], list[Unit], list[str]]:
    """One compile's preprocessing passes: their names, each pass's lines of the user's files, and what failed. Kept
    by _key: a one-file extension's torch half (torch's headers read without a precompiled header, 1-9 s) is
    preprocessed again only when its code changes, as it is compiled again only then."""
    key, numbers = _key(rel, argv, src, editable, d)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            old, passes, units = _CACHE[key]
            return [f"{p} (kept)" for p in passes], _moved(units, rel, old, numbers), []
    tmp = Path(tempfile.mkdtemp(dir=d))
    steps = _preprocess_argv(rel, argv, tmp, src)
    if isinstance(steps, str):
        return [], [], [f"{rel}: {steps}"]
    passes, units, failed = [], [], []
    procs = [(name, step, subprocess.Popen(step, cwd=src, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True)) for name, step in steps]
    for name, step, proc in procs:       # the host and device passes run side by side
        try:
            _, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed.append(f"{rel} ({name}): the preprocessor ran past {TIMEOUT_S:g} s")
            continue
        outp = Path(step[step.index("-o") + 1])
        if proc.returncode != 0 or not outp.is_file():
            failed.append(f"{rel} ({name}): " + (" ".join(err.split())[:200] or f"exit {proc.returncode}"))
            continue
        compiled = Path(argv[argv.index("-c") + 1]).name
        passes.append(f"{name} {rel}" + (f" ({compiled})" if compiled != Path(rel).name else ""))
        units.append(_user_lines(outp.read_text(errors="replace"), src, editable))
    if not failed:
        with _CACHE_LOCK:
            _CACHE[key] = (numbers, passes, units)
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return passes, units, failed


def expand(task: Task, src_dir: Path | None = None) -> Expanded:
    """The task's editable sources as compiled (see the module doc), from `src_dir` (default the task's folder)."""
    t0 = time.monotonic()
    src = Path(src_dir or task.root).resolve()
    res = Expanded()
    editable = set(task.spec.editable)
    seen: set[tuple[str, int, str, bool]] = set()
    with tempfile.TemporaryDirectory(prefix="agent-expand-") as d:
        commands, res.failed = _commands(task, src, Path(d))
        for rel, argv in commands:
            passes, units, failed = _preprocess(rel, argv, src, Path(d), editable)
            res.kept += [p[:-len(" (kept)")] for p in passes if p.endswith(" (kept)")]
            res.passes += [p.removesuffix(" (kept)") for p in passes]
            res.failed += failed
            res.units += units
            for item in (item for unit in units for item in unit):
                if item not in seen:
                    seen.add(item)
                    if not item[3]:
                        res.lines.append(item[:3])
                    elif spaces := " ".join(_KEYWORD.findall(item[2])):
                        res.lines.append((item[0], item[1], spaces))    # a pasted `__dev` `ice__` is the user's
    res.seconds = time.monotonic() - t0
    return res

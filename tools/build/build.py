"""Build a task's sources into lib<task>.so with ninja; read ptxas resources per kernel.

One compile edge per source (nvcc for .cu, c++ for .cpp/.cc/.cxx) with a depfile so that headers
count, then one link edge. Each object's compiler output is kept beside it (obj/X.o.log), so the
ptxas report of an object that did not need rebuilding is still read. CUDA libraries link cudart
statically: they load (and their launch plan can be asked) on a machine without a driver.

    python -m tools.build kernels/TASK [--build-dir D] [--json]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from tools.backends.device import DEFAULT_ARCH, arch_flags, resolve_arch
from tools.backends.cu_split import prepare as prepare_split, same_code
from tools.backends.pch import ensure as ensure_pch, included_sources, pch_flags, pch_sources
from tools.backends.toolchain import cuda_home, demangle, find_cxx, find_ninja, find_nvcc, takes_flag, toolchain_hint
from tools.results import BuildResult, BuildStatus, KernelResources
from tools.build import objcache
from tools.build.output import STATUS_MARK, first_errors, parse_ptxas
from tools.build.reuse import reusable_from, reusable_halves
from tools.isolation.sandbox import ProcStatus, run_isolated
from tools.task import Task, TaskError, load_task

CXX_EXT = {".cpp", ".cc", ".cxx", ".c"}
CU_EXT = {".cu"}
CXX_FLAGS = ["-O3", "-march=native", "-fPIC", "-std=c++17"]
TORCH_OPT = ["-O3", "-march=native"]     # a torch extension's, after torch's own flags (cxx_flags_of)
# Device code at -O3; the host side of a .cu file is the launcher, where gcc's -O3 buys nothing and
# costs about 0.4 s of every rebuild (measured: host compile 1.09 s at -O3, 0.65 s at -O1). A task can
# raise it with build.flags = ["-Xcompiler", "-O3"].
NVCC_FLAGS = ["-O3", "-lineinfo", "-std=c++17", "-Xcompiler", "-fPIC,-O1", "-Xptxas", "-v"]


# --- ninja file -------------------------------------------------------------------------------
def _nj(s: str) -> str:
    """Escape a path for a ninja build line."""
    return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _val(s: str) -> str:
    """Escape a variable value (shell-quoted words) for ninja."""
    return s.replace("$", "$$")


def obj_name(rel: str) -> str:
    return "obj/" + rel.replace("/", "__") + ".o"


def _forwardable(flag: str) -> bool:
    return flag.startswith(("-D", "-U", "-I"))


def folder_free(cxx: str, src_dir: Path, build_dir: Path) -> list[str]:
    """The C++ compiler's flags that keep the folders a build ran in out of its objects: `__FILE__` (an assert's,
    TORCH_CHECK's message) names the file as the task names it (`kernel.cpp`, not the run's worktree's absolute path),
    as ccache's manual advises. An object that holds no folder is the same bytes wherever the task is built, so the
    machine's object cache links it in the next folder (`agent check`, then a run's worktree, then a sweep's
    configuration; tools.build.objcache) where it compiled it again (8-16 s for a file with torch's headers on 2
    cores). Not for nvcc: -lineinfo writes the folder into the device code whatever the host compiler is told. None
    for a compiler without the flag (gcc before 8, clang before 10). The source folder first and the build folder
    second, unless the source folder is inside the build folder (a sweep's configuration): gcc tries the last given
    first, and the order is part of the edge that the cache and tools.build.reuse compare."""
    if not takes_flag(cxx, "-fmacro-prefix-map=/a=b"):
        return []
    dirs = [build_dir, src_dir] if src_dir.is_relative_to(build_dir) else [src_dir, build_dir]
    return [f"-fmacro-prefix-map={d}/=" for d in dirs]


def cxx_flags_of(task: Task, src_dir: Path, nvcc: str | None) -> list[str]:
    """The C++ compiler's flags for the task's .cpp files (and a precompiled header's, tools.backends.pch). A ctypes
    task: the agent's defaults, the task's folder, then build.flags. A torch extension: torch's own (what its
    load_inline passes: its defines, -fPIC, its -std; tools.backends.torchpaths), the task's folder, the form's
    (torch's folders, the module's name), the agent's -O3 -march=native unless build.defaults = "load_inline" (an
    imported KernelBench solution: its extra_cflags in build.flags), then build.flags: one precompiled
    torch/extension.h serves both kinds and the KernelBench export's own build. Where torch's writer cannot be asked,
    the agent's flags (load_inline's: an error saying so)."""
    flags = list(task.spec.build.flags)
    cuda = task.backend.gpu
    form = task.backend.build_flags().cxx
    base, opt = CXX_FLAGS, []
    if task.spec.form == "torch_extension":
        from tools.backends.torchpaths import torch_jit_cflags
        try:
            base, opt = torch_jit_cflags(), ([] if task.spec.build.defaults == "load_inline" else TORCH_OPT)
            # torch's defines are its own (a define its build does not pass, the ABI's, changes what the headers
            # mean, and a precompiled header made with it would not serve KernelBench's build of the export)
            form = [f for f in form if not f.startswith("-D") or f.startswith("-DTORCH_EXTENSION_NAME=")]
        except ValueError:
            if task.spec.build.defaults == "load_inline":
                raise
    out = base + ["-I" + str(src_dir)] + form + opt \
        + (flags if not cuda else [f for f in flags if _forwardable(f)])
    home = cuda_home(nvcc)
    return out + (["-I" + str(home / "include")] if cuda and home else [])


def write_ninja(task: Task, build_dir: Path, src_dir: Path, tools: dict[str, str],
                arch: str | None, prebuilt: dict[str, Path] | None = None,
                pch: tuple[Path, list[str]] | None = None, split: dict | None = None,
                inside: set[str] | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """Write build.ninja; return [(source rel path, object path)] of the compile edges, and each
    compile and link command as a person would type it (for the review: which flags built this).
    `prebuilt` maps a source to an object built earlier (reusable_objects): linked, not compiled.
    `pch`: (the folder holding torch/extension.h.gch, the sources compiled with it) (tools.backends.pch).
    `split`: a one-file CUDA extension's halves by source (tools.backends.cu_split.prepare), compiled apart.
    `inside`: the sources another source includes (tools.backends.pch.included_sources), where the caller has them."""
    prebuilt = prebuilt or {}
    cuda = task.backend.gpu
    form = task.backend.build_flags()      # what the kernel's form adds (torch's headers and libraries)
    flags = list(task.spec.build.flags)
    q = lambda args: " ".join(shlex.quote(a) for a in args)  # noqa: E731
    inc = ["-I" + str(src_dir)]
    cxx_flags = cxx_flags_of(task, src_dir, tools.get("nvcc"))
    pch_args = ["-I" + str(pch[0]), "-Winvalid-pch"] if pch else []
    lines = [
        "ninja_required_version = 1.5",
        f"cxx = {_val(shlex.quote(tools['c++']))}",
        f"cxxflags = {_val(q(cxx_flags))}",
    ]
    # compiler output goes to <obj>.log first, then is printed: a cached object keeps its report
    tail = "> $obj.log 2>&1; s=$$?; cat $obj.log; exit $$s"
    lines += ["rule cxx", f"  command = $cxx $cxxflags $pch $ops -MD -MF $obj.d -c $src -o $obj {tail}",
              "  depfile = $out.d", "  deps = gcc", "  description = CXX $out"]
    if tools.get("nvcc"):
        nv_flags = NVCC_FLAGS + arch_flags(arch or DEFAULT_ARCH) + inc + form.cxx + form.nvcc + (flags if cuda else [])
        lines += [f"nvcc = {_val(shlex.quote(tools['nvcc']))}", f"nvccflags = {_val(q(nv_flags))}",
                  "rule nvcc", f"  command = $nvcc $nvccflags $ops -MD -MF $obj.d -c $src -o $obj {tail}",
                  "  depfile = $out.d", "  deps = gcc", "  description = NVCC $out"]
    if cuda and form.linker == "native":
        link = ["$nvcc", "-shared", "-cudart", "static", *arch_flags(arch or DEFAULT_ARCH), "-Xlinker", "--no-undefined"]
        link_flags = [f for f in flags if not f.startswith("-Xptxas")]
    else:
        link = ["$cxx", "-shared"] + (["-Wl,--no-undefined"] if form.no_undefined else [])
        # gcc before 13 links crtfastmath.o into a shared library for these: FTZ/DAZ set in the caller's process at load
        link_flags = [{"-Ofast": "-O3"}.get(f, f) for f in flags if (not cuda or _forwardable(f))
                      and f not in ("-ffast-math", "-funsafe-math-optimizations")]
    lines += ["rule link", f"  command = {' '.join(link)} {_val(q(link_flags))} -o $out $in {_val(q(form.link))}",
              "  description = LINK $out"]
    edges, commands = [], []

    unbound = folder_free(tools["c++"], src_dir, build_dir)

    def edge(rel: str, path: Path, rule: str, extra: list[str]) -> None:
        obj, src = obj_name(rel), str(path.resolve())
        with_pch = bool(pch) and rule == "cxx" and rel in pch[1]  # type: ignore[index]
        own = extra + task.backend.source_flags(path.read_text(errors="replace"))  # a TORCH_LIBRARY source's
        own += unbound if rule == "cxx" else []
        compiler, cflags = (tools["nvcc"], nv_flags) if rule == "nvcc" else (tools["c++"], cxx_flags)
        # a linked object's command too (the same flags compiled it: tools.build.reuse, objcache), said as such
        commands.append(f"{Path(compiler).name} {q(cflags + (pch_args if with_pch else []) + own)} -c {rel} -o {obj}"
                        + ("   # linked, compiled by an earlier build with these flags" if rel in prebuilt else ""))
        if rel in prebuilt:
            return
        lines.extend([f"build {_nj(obj)}: {rule} {_nj(src)}", f"  src = {_val(shlex.quote(src))}",
                      f"  obj = {_val(shlex.quote(obj))}"] + [f"  pch = {_val(q(pch_args))}"] * with_pch
                     + [f"  ops = {_val(q(own))}"] * bool(own))
        edges.append((rel, obj))

    inside = included_sources(task, src_dir) if inside is None else inside
    for rel in task.spec.sources:
        ext = Path(rel).suffix
        if ext not in CXX_EXT | CU_EXT or rel in inside:
            continue  # headers and sources another source includes: inputs through the depfiles, not edges
        if rel in (split or {}):       # tools.backends.cu_split: the kernels by nvcc, the torch code by c++
            here = ["-I" + str((src_dir / rel).parent.resolve())]
            edge(f"{rel}.kernels.cu", split[rel].kernels, "nvcc", here)  # type: ignore[index]
            edge(f"{rel}.host.cpp", split[rel].host, "cxx", here)  # type: ignore[index]   (linked where prebuilt)
            continue
        edge(rel, src_dir / rel, "nvcc" if ext in CU_EXT else "cxx", [])
    lib = f"lib{task.name}.so"
    link_cmd = " ".join(link).replace("$nvcc", Path(tools.get("nvcc") or "nvcc").name).replace(
        "$cxx", Path(tools["c++"]).name)
    objects = [o for _, o in edges] + [str(p) for p in prebuilt.values()]
    commands.append(f"{link_cmd} {q(link_flags)} -o {lib} " + " ".join(f"obj/{Path(o).name}" for o in objects)
                    + (" " + q(form.link) if form.link else ""))
    lines += [f"build {_nj(lib)}: link {' '.join(_nj(o) for o in objects)}", f"default {_nj(lib)}", ""]
    text = "\n".join(lines)
    path = build_dir / "build.ninja"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return edges, commands


def find_tools(task: Task) -> tuple[dict[str, str | None], bool]:
    """The build's tools (ninja, c++, and nvcc where the task has CUDA code) and whether nvcc is needed."""
    need_nvcc = task.backend.gpu or any(Path(s).suffix in CU_EXT for s in task.spec.sources)
    return {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc() if need_nvcc else None}, need_nvcc


# --- the build --------------------------------------------------------------------------------
def build(task: Task, build_dir: Path, src_dir: Path | None = None, timeout_s: float | None = None,
          reuse: Path | list[Path] | None = None, whole: bool = False) -> BuildResult:
    """Build task's sources (from src_dir, default task.root) in build_dir. Never raises for bad code.
    `reuse`: earlier build folders of the same task whose objects are linked instead of compiled where still valid
    (the same bytes and commands: tools.build.reuse). A one-file CUDA extension is built in two halves
    (tools.backends.cu_split) unless `whole`; where the halves do not build, the file is built whole."""
    t0 = time.monotonic()
    build_dir = Path(build_dir).resolve()
    src_dir = Path(src_dir or task.root).resolve()
    timeout_s = timeout_s if timeout_s is not None else task.spec.build.timeout_s
    tools, need_nvcc = find_tools(task)
    missing = [t for t, p in tools.items() if p is None and (t != "nvcc" or need_nvcc)]
    commands: list[str] = []
    arch = resolve_arch(task) if need_nvcc else None

    def result(status: BuildStatus, **kw) -> BuildResult:
        return BuildResult(status=status, build_dir=str(build_dir), seconds=time.monotonic() - t0, arch=arch,
                           commands=commands, **kw)

    if missing:
        return result(BuildStatus.toolchain_missing, message="; ".join(toolchain_hint(t) for t in missing))
    why = task.backend.unbuildable()
    if why:
        return result(BuildStatus.toolchain_missing, message=why)
    (build_dir / "tmp").mkdir(parents=True, exist_ok=True)    # the compilers' TMPDIR: what a killed gcc leaves stays here
    inside = included_sources(task, src_dir)      # part of another source's translation unit (load_inline's main.cpp)
    objects = {rel: obj_name(rel) for rel in task.spec.sources if Path(rel).suffix in CXX_EXT | CU_EXT and rel not in inside}
    pch_note, prebuilt, cached = "", {}, {}
    try:
        split, split_note = ({}, "") if whole else prepare_split(task, src_dir, build_dir)
        pch = None
        eased = pch_sources(task, src_dir, inside=inside) + [f"{rel}.host.cpp" for rel, h in split.items() if h.pch]
        fixed = pch_sources(task, src_dir, editable=False, inside=inside)     # the binding: only where one is cached
        if eased or fixed:
            got = ensure_pch(tools["c++"], pch_flags(cxx_flags_of(task, src_dir, tools["nvcc"]), src_dir),  # type: ignore[arg-type]
                             timeout_s, make=bool(eased))
            pch = (got.include_dir, eased + fixed) if got.include_dir else None
            # the edge of a reused object names the header's folder: an earlier build linked only with the same one
            pch_note = f"\n== pch ==\n{got.note}" if eased or got.include_dir else ""
        edges, commands = write_ninja(task, build_dir, src_dir, tools, arch, None, pch, split, inside)  # type: ignore[arg-type]
        halves = {f"{r}.host.cpp": (obj_name(f"{r}.host.cpp"), h.host) for r, h in split.items()}
        if reuse:
            prebuilt = reusable_from(task, reuse, tools["ninja"], objects, src_dir, build_dir / "build.ninja") \
                | reusable_halves(reuse, tools["ninja"], halves, src_dir, build_dir / "build.ninja", same_code)  # type: ignore[arg-type]
        # what no earlier build of this task holds, the machine's object cache may (the same bytes built elsewhere)
        cached = objcache.lookup(tools["ninja"], build_dir, src_dir,  # type: ignore[arg-type]
                                 {r: o for r, o in objects.items() if r not in prebuilt and r not in split})
        if prebuilt := prebuilt | cached:
            edges, commands = write_ninja(task, build_dir, src_dir, tools, arch, prebuilt, pch, split, inside)  # type: ignore[arg-type]
    except (OSError, ImportError, ValueError) as e:   # torch, its CUDA toolkit or a renamable TORCH_LIBRARY missing
        return result(BuildStatus.toolchain_missing, message=f"{task.backend.name}: {' '.join(str(e).split())}")
    if not edges and not prebuilt:   # every object linked from an earlier build of the same bytes is a build
        return result(BuildStatus.compile_error, message=f"no compilable sources (.cu/.cpp) among {task.spec.sources}")
    proc = run_isolated([tools["ninja"], "-C", str(build_dir)], timeout_s,  # type: ignore[list-item]
                        env={"NINJA_STATUS": STATUS_MARK + "[%f/%t] ", "TMPDIR": str(build_dir / "tmp")})
    output = proc.stdout + proc.stderr
    steps = sum(1 for ln in output.splitlines() if ln.startswith(STATUS_MARK))
    ran = {ln.split()[-1] for ln in output.splitlines() if ln.startswith(STATUS_MARK)}
    log = _collect_logs(build_dir, edges, ran) + "".join(f"\n== {rel} ({'object cache' if rel in cached else 'reused'}: "
                                                         f"{obj}) ==" for rel, obj in prebuilt.items()) \
        + pch_note + (f"\n== split ==\n{split_note}" if split_note else "") + "\n== ninja ==\n" + output
    (build_dir / "build.log").write_text(log)
    if split and proc.status == ProcStatus.failed:     # a split the compilers refuse: the file as it is
        res = build(task, build_dir, src_dir, max(1.0, timeout_s - (time.monotonic() - t0)), reuse, whole=True)
        res.log = f"== the halves (tools.backends.cu_split) did not build; built whole ==\n{log}\n{res.log}"
        res.seconds = time.monotonic() - t0
        return res
    if proc.status == ProcStatus.timeout:
        return result(BuildStatus.timeout, steps_run=steps, log=log,
                      message=f"build timed out after {timeout_s:.0f}s (raise [build] timeout_s in task.toml?)")
    if proc.status == ProcStatus.not_started:
        return result(BuildStatus.toolchain_missing, message=proc.reason(), log=log)
    if proc.status != ProcStatus.ok:
        msg = first_errors(output, src_dir, [t for t in tools.values() if t] + ["$nvcc", "$cxx"])
        return result(BuildStatus.compile_error, message=msg, steps_run=steps, log=log)
    objcache.store(tools["ninja"], build_dir / "build.ninja", build_dir, src_dir,  # type: ignore[arg-type]
                   [(rel, obj) for rel, obj in edges if obj in ran])
    kernels: list[KernelResources] = []
    for logf in [build_dir / (obj + ".log") for _, obj in edges] + [Path(f"{o}.log") for o in prebuilt.values()]:
        if logf.name.endswith(".cu.o.log") and logf.exists():
            kernels += parse_ptxas(logf.read_text())
    names = demangle([k.mangled for k in kernels], tools.get("nvcc"))
    for k in kernels:
        k.name = names.get(k.mangled, k.mangled)
    return result(BuildStatus.ok, lib_path=str(build_dir / f"lib{task.name}.so"), steps_run=steps, log=log,
                  kernels=kernels)


def _collect_logs(build_dir: Path, edges: list[tuple[str, str]], ran: set[str]) -> str:
    parts = []
    for rel, obj in edges:
        logf = build_dir / (obj + ".log")
        text = logf.read_text() if logf.exists() else ""
        parts.append(f"== {rel} ({'compiled' if obj in ran else 'cached'}) ==\n{text.rstrip()}")
    return "\n".join(parts)


# --- CLI --------------------------------------------------------------------------------------
def default_build_dir(task: Task) -> Path:
    """runs/_build/NAME under the git repository that holds the task (the user's: never this
    project's checkout or install), or under the task's folder where no repository holds it."""
    root = next((d for d in (task.root, *task.root.parents) if (d / ".git").exists()), task.root)
    return root / "runs" / "_build" / task.name


def render(res: BuildResult) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from tools.console import make_console
    con = make_console()
    color = "green" if res.status == BuildStatus.ok else "red"
    con.print(f"[{color}]{res.status.value}[/{color}] {res.seconds:.2f}s, {res.steps_run} steps"
              + (f", arch {escape(res.arch)}" if res.arch else "")
              + (f"\n{escape(res.lib_path)}" if res.lib_path else ""))
    if res.message:
        con.print(res.message, markup=False, highlight=False)
    if res.kernels:
        t = Table("kernel", "regs", "spill st/ld B", "stack B", "smem B", "cmem B")
        for k in res.kernels:
            spill = f"{k.spill_stores_bytes}/{k.spill_loads_bytes}"
            t.add_row(Text(k.name), str(k.registers), f"[red]{spill}[/red]" if k.spill_stores_bytes else spill,
                      str(k.stack_frame_bytes), str(k.smem_static_bytes), str(k.cmem_bytes))
        con.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.build", description="Build a task with ninja.")
    ap.add_argument("task", help="kernels/TASK (a folder with task.toml)")
    ap.add_argument("--build-dir", type=Path, default=None)
    ap.add_argument("--src-dir", type=Path, default=None, help="read sources from here (default: the task folder)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        task = load_task(args.task)
    except TaskError as e:
        print(f"bad task: {e}", file=sys.stderr)
        return 2
    res = build(task, args.build_dir or default_build_dir(task), args.src_dir)
    if args.json:
        print(res.model_dump_json())
    else:
        render(res)
    return 0 if res.status == BuildStatus.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Which objects of an earlier build of a task a new build may link instead of compiling.

tools.build.build takes them through `reuse`: the sweep builds every configuration with its initial build's
objects of the non-editable sources (a torch extension's binding: 15-25 s of torch's headers, once
per sweep instead of once per configuration), and a new run of `agent optimize` or `agent sweep`
starts from the latest earlier builds of the same task (`agent check`'s, earlier runs'), so that the
binding is compiled once per machine rather than once per run. An earlier build may be days old: an object is
linked only where ninja itself would not rebuild it (the same compile commands, every file it read
no newer than it) and where each file of the task it read has the same bytes here.

Editable files too (issue 61): a run's first build after `agent check` compiles the same bytes check compiled, and
a C++ file that includes torch's headers (a one-file extension, every imported KernelBench solution) costs 11-25 s
a build on 2 cores; it is linked from check's build instead. The rule is the same for every file (the bytes of
every task file it read, the compile commands, nothing newer outside the task): a candidate's edit changes the
bytes, and its file is compiled.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tools.task import Task


def ninja_rules(ninja_file: Path) -> str:
    """A build.ninja's compilers, flags and rules: everything before its first build edge."""
    try:
        text = ninja_file.read_text()
    except OSError:
        return ""
    return text.split("\nbuild ", 1)[0]


def swap_folders(line: str, pairs: dict[str, str]) -> str:
    """`line` with each folder of `pairs` replaced by its own in one pass, the longest first (an earlier build's
    folders by this build's: a build folder inside the task's folder stays a build folder)."""
    pat = re.compile("|".join(re.escape(k) for k in sorted(pairs, key=len, reverse=True)))
    return pat.sub(lambda m: pairs[m.group(0)], line) if pairs else line


def ninja_edge(ninja_file: Path, obj: str) -> list[str]:
    """The build edge of one object in a build.ninja, with its own variables (a source's -include)."""
    try:
        lines = ninja_file.read_text().splitlines()
    except OSError:
        return []
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"build {obj}:")), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


def reusable_objects(task: Task, earlier: Path, ninja: str, objects: dict[str, str],
                     src_dir: Path | None = None, ours: Path | None = None) -> dict[str, Path]:
    """The objects of `task`'s sources in an earlier build of the same task that can be linked as they are:
    compiled from the same bytes, the same for every file of the task they included (ninja's dependency log says
    which; editable ones too: their bytes decide), no file they read newer than the object, and (given `ours`, the
    new build's build.ninja) by the same compilers with the same flags. `objects`: each compiled source's object
    path inside a build folder (tools.build.build's naming)."""
    out: dict[str, Path] = {}
    src_dir = Path(src_dir or task.root).resolve()
    for rel, name in objects.items():
        obj = Path(earlier) / name
        if not obj.is_file():
            continue
        deps = ninja_deps(ninja, Path(earlier), name)
        if not deps or not str(deps[0]).endswith("/" + rel):
            continue
        root = Path(str(deps[0])[: -len(rel) - 1])          # the earlier build's source folder
        if ours is not None and ninja_rules(Path(earlier) / "build.ninja").replace(f"-I{root}", f"-I{src_dir}") != ninja_rules(ours):
            continue          # other compilers or flags (torch's, the task's build.flags, the arch)
        # the edge names both folders (the source's, and build.folder_free's -fmacro-prefix-map): this build's in its place
        swap = {str(root): str(src_dir), **({str(Path(earlier).resolve()): str(ours.parent)} if ours is not None else {})}
        if ours is not None and [swap_folders(ln, swap) for ln in ninja_edge(Path(earlier) / "build.ninja", name)] \
                != ninja_edge(ours, name):
            continue          # the source's own flags differ (tools.backends.torch_library's header, another torch's)
        made = obj.stat().st_mtime_ns
        try:
            # a header outside the task (torch's, the compiler's) changed since, or a file of the task in the earlier
            # build's own folder did (the user edited and committed kernel.cpp after `agent check`: the bytes here
            # are the new ones, the object is of the old ones)
            if any(d.stat().st_mtime_ns > made for d in deps):
                continue
        except OSError:
            continue          # one is gone: torch or the compiler was reinstalled
        mine = [d.relative_to(root) for d in deps if d.is_relative_to(root)]
        if all((src_dir / r).is_file() and (root / r).is_file() and (src_dir / r).read_bytes() == (root / r).read_bytes()
               for r in mine):
            out[rel] = obj.resolve()
    return out


def reusable_from(task: Task, earlier: Path | list[Path], ninja: str, objects: dict[str, str],
                  src_dir: Path | None = None, ours: Path | None = None) -> dict[str, Path]:
    """reusable_objects over several earlier builds, the first that has a valid object winning (a sweep's
    configuration: its initial build, then the build the initial build itself linked from)."""
    out: dict[str, Path] = {}
    for d in [earlier] if isinstance(earlier, Path) else earlier:
        left = {rel: name for rel, name in objects.items() if rel not in out}
        out.update(reusable_objects(task, d, ninja, left, src_dir, ours) if left else {})
    return out


def latest_builds(task: Task, runs: Path, exclude: Path | None = None, most: int = 4) -> list[Path]:
    """The most recent builds of `task` under a runs folder (`agent check`'s runs/_build/NAME, runs'
    runs/RUN/build), newest first, for a new run or sweep to link objects from (a build that linked its binding
    itself holds none: the next one back may)."""
    cands = [runs / "_build" / task.name, *(d for d in runs.glob("*/build") if not _live(d.parent))]
    built = [(lib.stat().st_mtime_ns, d) for d in cands if d != exclude and (lib := d / f"lib{task.name}.so").is_file()]
    return [d for _, d in sorted(built, reverse=True)[:most]]


def _live(run_dir: Path) -> bool:
    """A run another agent process drives now (runs/RUN/agent.lock names its pid: agent/records/store.py hold_run): its
    build folder is rewritten for every candidate it builds, so an object found valid there may be another
    candidate's by the time it is linked. Read, not locked: a probe's lock would refuse that run's own resume."""
    import os
    try:
        pid = int((run_dir / "agent.lock").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):   # no lock file, no pid in it, or the process is gone
        return False
    return pid != os.getpid()


def ninja_deps(ninja: str, folder: Path, name: str) -> list[Path]:
    """What ninja's dependency log says `name` read in `folder` (the source first), if it is valid; a relative path
    is the folder's."""
    try:
        proc = subprocess.run([ninja, "-C", str(folder), "-t", "deps", name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = proc.stdout.splitlines()
    if proc.returncode or not lines or "(VALID)" not in lines[0]:
        return []
    return [p if p.is_absolute() else Path(folder) / p for p in (Path(ln.strip()) for ln in lines[1:] if ln.strip())]


def reusable_halves(earlier: Path | list[Path], ninja: str, halves: dict[str, tuple[str, Path]], src_dir: Path,
                    ours: Path, same) -> dict[str, Path]:
    """Objects of a file the build writes (tools.backends.cu_split's torch half of a one-file .cu) from earlier
    builds of the task (a sweep's initial build, `agent check`'s): linked where an earlier build compiled
    the same code (`same`: its #line numbers aside) by the same rules and edge, no file it read is newer
    than it, and each file of the task it read has the same bytes here. `halves`: the edge's name (X.cu.host.cpp)
    -> (its object's path inside a build folder, this build's file)."""
    out: dict[str, Path] = {}
    for name, (obj_rel, here) in halves.items():
        for d in [earlier] if isinstance(earlier, Path) else earlier:
            obj, there = Path(d) / obj_rel, Path(d) / "split" / here.name
            if not (obj.is_file() and there.is_file()) or not same(there.read_text(), here.read_text()):
                continue
            deps = ninja_deps(ninja, Path(d), obj_rel)
            user = re.search(r'(?m)^#line \d+ "(/[^"]+)"$', there.read_text())
            rel = name.removesuffix(".host.cpp")
            if not deps or deps[0].resolve() != there.resolve() or not user or not user.group(1).endswith("/" + rel):
                continue
            root = Path(user.group(1)[: -len(rel) - 1])      # the earlier build's source folder
            swap = {str(Path(d).resolve()): str(ours.parent), str(root): str(src_dir)}
            if ninja_rules(Path(d) / "build.ninja").replace(f"-I{root}", f"-I{src_dir}") != ninja_rules(ours) \
                    or [swap_folders(ln, swap) for ln in ninja_edge(Path(d) / "build.ninja", obj_rel)] != ninja_edge(ours, obj_rel):
                continue      # other compilers, flags or per-file flags
            made, rest = obj.stat().st_mtime_ns, deps[1:]
            try:
                if any(p.stat().st_mtime_ns > made for p in deps):   # the split file itself too (deps[0])
                    continue  # torch's or the compiler's headers changed since, or the task's own files there
            except OSError:
                continue
            mine = [p.relative_to(root) for p in rest if p.is_relative_to(root)]
            if all((src_dir / r).is_file() and (src_dir / r).read_bytes() == (root / r).read_bytes() for r in mine):
                out[name] = obj.resolve()
                break
    return out

"""Which objects of an earlier build of a task a new build may link instead of compiling.

tools.build takes them through `reuse`: the sweep builds every configuration with its initial build's
objects of the non-editable sources (a torch extension's binding: 15-25 s of torch's headers, once
per sweep instead of once per configuration).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools.task import Task


def reusable_objects(task: Task, earlier: Path, ninja: str, objects: dict[str, str],
                     src_dir: Path | None = None) -> dict[str, Path]:
    """The objects of `task`'s non-editable sources in an earlier build of the same task (the sweep's
    initial build) that can be linked as they are: compiled from the same bytes, the same for every
    file of the task they included (ninja's dependency log says which), none of them editable. A
    torch extension's binding then costs 15-25 s once per sweep, not once per configuration.
    `objects`: each compiled source's object path inside a build folder (tools.build's naming)."""
    out: dict[str, Path] = {}
    src_dir = Path(src_dir or task.root).resolve()
    for rel, name in objects.items():
        obj = Path(earlier) / name
        if rel in task.spec.editable or not obj.is_file():
            continue
        try:
            proc = subprocess.run([ninja, "-C", str(earlier), "-t", "deps", name], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = proc.stdout.splitlines()
        deps = [Path(ln.strip()) for ln in lines[1:] if ln.strip()]
        if proc.returncode or not lines or "(VALID)" not in lines[0] or not deps or not str(deps[0]).endswith("/" + rel):
            continue
        root = Path(str(deps[0])[: -len(rel) - 1])          # the earlier build's source folder
        ours = [d.relative_to(root) for d in deps if d.is_relative_to(root)]
        if all(str(r) not in task.spec.editable and (src_dir / r).is_file() and (root / r).is_file()
               and (src_dir / r).read_bytes() == (root / r).read_bytes() for r in ours):
            out[rel] = obj.resolve()
    return out

"""The build's command lines without building: what a person or a model reads to know which flags and target the
kernel gets (issue 63: a model that is not told them guesses the -O level, -march and the GPU target)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tools.backends.device import resolve_arch
from tools.build.build import find_tools, write_ninja
from tools.task import Task


def build_commands(task: Task, src_dir: Path | None = None) -> list[str]:
    """Each compile and link command of the task's build as build() would run it (write_ninja's, written into a
    folder removed after; the precompiled header and a one-file extension's split left out), for a person or a model
    to read which flags and target the kernel gets, or for the scan to preprocess (tools/build/expand.py; `src_dir`:
    a candidate's copy of the task's folder). [] where the compilers or torch cannot be asked."""
    tools, need_nvcc = find_tools(task)
    if tools["c++"] is None or (need_nvcc and tools["nvcc"] is None):
        return []
    with tempfile.TemporaryDirectory(prefix="agent-commands-") as d:
        try:
            return write_ninja(task, Path(d), Path(src_dir or task.root).resolve(), tools,  # type: ignore[arg-type]
                               resolve_arch(task) if need_nvcc else None)[1]
        except (OSError, ImportError, ValueError):
            return []

"""What the compilers print, read: ptxas' resources per kernel, and the first error lines of a failed build."""

from __future__ import annotations

import re
from pathlib import Path

from tools.results import KernelResources

STATUS_MARK = "@@ninja "          # NINJA_STATUS prefix: one such line per edge that ran

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
# ptxas' numbered notes on an sm_90a kernel's wgmma pipeline (C7511: serialized for want of registers, C7515: an
# accumulator written between wgmmas, C7517/C7519: a wait or an arrive it injected): why a wgmma kernel is slow, said by
# the assembler before anything runs (issue 63: the real model asked for them)
_NOTE = re.compile(r"ptxas info\s*:\s*\((C\d{4})\)\s*(.*?)\s*(?:in (?:the )?function '([^']+)')?\s*$")
NOTE_CHARS = 200


def parse_ptxas(text: str) -> list[KernelResources]:
    """Entry functions from `-Xptxas -v` output (mangled names; see demangle())."""
    kernels: dict[str, KernelResources] = {}
    notes: dict[str, list[str]] = {}
    entry = props_for = None
    for line in text.splitlines():
        if (m := _NOTE.search(line)) and m.group(3):
            said = f"({m.group(1)}) {m.group(2)}"
            if said not in notes.setdefault(m.group(3), []):
                notes[m.group(3)].append(said[:NOTE_CHARS])
        elif m := _ENTRY.search(line):
            entry = m.group(1)
            kernels.setdefault(entry, KernelResources(name=entry, mangled=entry))
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif (m := _FRAME.search(line)) and props_for in kernels:
            k = kernels[props_for]
            k.stack_frame_bytes, k.spill_stores_bytes, k.spill_loads_bytes = (int(x) for x in m.groups())
        elif (m := _USED.search(line)) and entry in kernels:
            k = kernels[entry]
            k.registers = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                k.smem_static_bytes = int(s.group(1))
            k.cmem_bytes = sum(int(c) for c in re.findall(r"(\d+) bytes cmem\[\d+\]", line))
    for name, said in notes.items():
        if name in kernels:
            kernels[name].advisories = said
    return list(kernels.values())


_ERR_PATTERNS = [
    re.compile(r"^(?P<file>[^\s:(][^:(]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error\b"),     # gcc/clang
    re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?:catastrophic )?error\b"),     # nvcc front end
    re.compile(r"^(ptxas|nvlink|nvcc)\s*(fatal|error)\s*:", re.I),
    re.compile(r"(undefined reference to|collect2: error|/ld: |ninja: error:)"),
    re.compile(r"\berror\b:", re.I),
]
_NOISE = re.compile(rf"^({re.escape(STATUS_MARK)}|FAILED:|ninja: build stopped|\d+ errors? detected)")


def first_errors(output: str, src_dir: Path, commands: list[str], max_lines: int = 12) -> str:
    """The first error lines (file:line first), with the source dir stripped from paths."""
    prefix = str(src_dir.resolve()) + "/"
    lines = []
    for raw in output.splitlines():
        line = raw.replace(prefix, "")
        if _NOISE.search(line) or any(c and line.lstrip().startswith(c) for c in commands) or not line.strip():
            continue
        line = re.sub(r"^([^\s(][^(]*)\((\d+)\): ", r"\1:\2: ", line)  # nvcc's file(12): -> file:12:
        lines.append(line)
    for pat in _ERR_PATTERNS:
        idx = next((i for i, ln in enumerate(lines) if pat.search(ln)), None)
        if idx is not None:
            return "\n".join(lines[idx:idx + max_lines])
    return "\n".join(lines[-max_lines:]) or "the build failed without compiler output"

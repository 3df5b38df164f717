"""compute-sanitizer's report read (tools/judge/sanitize.py): how many errors, the first one's lines, what each tool's
failure means to the user."""

from __future__ import annotations

import re

# "========= Invalid __global__ read of size 16 bytes" and the lines under it, up to the next "=========" blank
_ERROR = re.compile(r"^=+ (Invalid |Misaligned |Out-of-range |Malloc/Free error|Cuda API error|Program hit|"
                    r"Barrier error|Warp |Uninitialized |Device heap|Error: Race reported)", re.M)
_SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?)", re.M)


def parse_log(text: str) -> tuple[int, str]:
    """(errors, the first error's lines joined) from a compute-sanitizer report. The count is the summary's where
    the report has one (the sanitizer ended), else the error headers counted."""
    heads = list(_ERROR.finditer(text))
    m = _SUMMARY.search(text)
    n = int(m.group(1) or m.group(2)) if m else len(heads)
    if not heads:
        return n, ""
    block = []
    for line in text[heads[0].start():].splitlines()[:8]:
        line = line.lstrip("= ").strip()
        if not line and block:
            break
        if line.startswith("Saved host backtrace"):
            break                 # the host frames: the launch's call stack, not the access
        if line:
            block.append(line)
    return n, "; ".join(block)[:600]


# what each tool's failure means to the user
WHAT = {"memcheck": ("invalid access", "invalid accesses", "the kernel reads or writes outside its tensors (right outputs "
                     "or not, on a user's tensor that is another allocation or a fault)"),
        "racecheck": ("shared-memory race", "shared-memory races", "threads of one block read and write the same "
                      "shared memory with no barrier between (right outputs here or not, the order is the scheduler's)")}

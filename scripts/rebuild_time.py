"""Rebuild time of a task after a one-line edit (BENCHMARKS.md "Rebuild after a one-line edit").

    python3 scripts/rebuild_time.py kernels/TASK FILE BUILD_DIR [EDITS]

One cold build of the task into BUILD_DIR (removed first), then FILE (one of its sources) with one
comment line added, EDITS times (default 3), each rebuilt; then the built library loaded in a fresh process, as
each judge's host loads it. The edit is undone whatever happens.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.build.build import build  # noqa: E402
from tools.task import load_task  # noqa: E402


def main(argv: list[str]) -> int:
    task_dir, rel, bd = argv[0], argv[1], Path(argv[2])
    edits = int(argv[3]) if len(argv) > 3 else 3
    task = load_task(task_dir)
    shutil.rmtree(bd, ignore_errors=True)
    r = build(task, bd)
    print(f"{task.name} ({task.backend.name}): cold {r.status.value} {r.seconds:.2f}s, {r.steps_run} steps "
          f"{r.message[:300]}")
    if r.status.value != "ok":
        return 1
    p = task.path(rel)
    src = p.read_text()
    try:
        for i in range(edits):
            p.write_text(f"// edit {i}\n" + src)
            r = build(task, bd)
            print(f"  one-line edit of {rel}, {i + 1} of {edits}: {r.status.value} {r.seconds:.2f}s, {r.steps_run} steps")
    finally:
        p.write_text(src)
    code = ("import sys, time; t0 = time.monotonic(); import torch; t1 = time.monotonic(); "
            "from tools.task import load_task; load_task(sys.argv[1]).backend.load(sys.argv[2]); "
            "print(f'  fresh process: import torch {t1 - t0:.2f}s, load the build {time.monotonic() - t1:.2f}s')")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, task_dir, r.lib_path], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    print((out.stdout.strip() or out.stderr[-500:]) + f" (process {time.monotonic() - t0:.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Where a rebuild's seconds go (BENCHMARKS.md "Rebuild after a one-line edit"): each command ninja
runs after a one-line edit, timed alone, and nvcc's own phases (nvcc --time: the host preprocessor,
cudafe++, cicc, ptxas, the host compiler).

    python3 scripts/rebuild_phases.py kernels/TASK FILE BUILD_DIR

A cold build of the task into BUILD_DIR (removed first), FILE with one comment line added, then the
commands of `ninja -n -v` (what the rebuild would run) one by one, each with its seconds; then the same
rebuild through tools.build.build.build, whose seconds less the commands' are the tool's own share (ninja,
the dependency log, demangling, the child's start). The edit is undone whatever happens.
"""

from __future__ import annotations

import csv
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.build.build import build  # noqa: E402
from tools.task import load_task  # noqa: E402
from tools.backends.toolchain import find_ninja  # noqa: E402


def nvcc_phases(path: Path) -> str:
    """nvcc --time's CSV as 'phase 1.23s, ...' (repeated phases summed)."""
    got: dict[str, float] = {}
    with open(path) as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[-1].strip() == "ms":
                name = row[1].strip()
                got[name] = got.get(name, 0.0) + float(row[-2]) / 1e3
    return ", ".join(f"{k} {v:.2f}s" for k, v in got.items() if k != "nvcc (driver)")


def main(argv: list[str]) -> int:
    task_dir, rel, bd = argv[0], argv[1], Path(argv[2]).resolve()
    task = load_task(task_dir)
    shutil.rmtree(bd, ignore_errors=True)
    r = build(task, bd)
    print(f"{task.name} ({task.backend.name}): cold build {r.status.value} {r.seconds:.2f}s, {r.steps_run} steps")
    if r.status.value != "ok":
        print(r.message[:2000])
        return 1
    ninja = find_ninja()
    p = task.path(rel)
    src = p.read_text()
    try:
        p.write_text("// edit\n" + src)
        dry = subprocess.run([ninja, "-C", str(bd), "-n", "-v"], capture_output=True, text=True, timeout=60)
        total = 0.0
        for i, cmd in enumerate(c for c in dry.stdout.splitlines() if c.startswith("[")):
            cmd = cmd.split("] ", 1)[1]
            first = shlex.split(cmd)[0]
            timing = bd / f"phases{i}.csv"
            if Path(first).name == "nvcc":
                cmd = cmd.replace(shlex.quote(first), f"{shlex.quote(first)} --time {shlex.quote(str(timing))}", 1)
            t0 = time.monotonic()
            out = subprocess.run(cmd, shell=True, cwd=bd, capture_output=True, text=True, timeout=600)
            dt = time.monotonic() - t0
            total += dt
            what = "link" if " -shared " in cmd else "compile"
            print(f"  {what} ({Path(first).name}) {dt:.2f}s rc={out.returncode}"
                  + (f": {nvcc_phases(timing)}" if timing.exists() else ""))
        print(f"  commands together {total:.2f}s")
        p.write_text("// edit 2\n" + src)
        r = build(task, bd)
        print(f"  the same edit through tools.build.build: {r.status.value} {r.seconds:.2f}s, {r.steps_run} steps "
              f"(the tool's own share about {r.seconds - total:.2f}s)")
    finally:
        p.write_text(src)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

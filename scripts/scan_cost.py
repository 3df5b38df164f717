"""The source scan's cost per candidate (issue 65), before and after it read the sources as compiled: for each task,
the written-text scan alone, the preprocessing (tools/build/expand.py) of a kernel edit and of the same with nothing
kept from an earlier candidate (a run's first: a one-file extension's torch half is read then), and a rebuild after a
one-line edit with and without the preprocessing beside it (as agent/evaluation/evaluate.py runs them). Medians of
REPS runs.

    python scripts/scan_cost.py [REPS] [TASK ...]

A TASK is a name under kernels/ or a task's folder (the seeds' one-file form: scripts/device/figures.sh seeds_form).
What a task's preprocessing could not read (tools/build/expand.py's reasons) is said under the table.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.build.build import build  # noqa: E402
from tools.build.expand import _CACHE, expand  # noqa: E402
from tools.build.scan import scan_expanded, scan_task  # noqa: E402
from tools.task import load_task  # noqa: E402


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    names = sys.argv[2:] or [d.name for d in sorted((ROOT / "kernels").iterdir()) if (d / "task.toml").is_file()]
    print("| task | written-text scan | preprocessing of a kernel edit (passes) | the same, nothing kept | rebuild after "
          "a one-line edit | the same with the preprocessing beside it |\n|---|---|---|---|---|---|")
    unread = []
    for name in names:
        folder = Path(name) if Path(name).is_dir() else ROOT / "kernels" / name
        name = folder.name
        with tempfile.TemporaryDirectory() as d:
            root = Path(d) / name
            shutil.copytree(folder, root, ignore=shutil.ignore_patterns("__pycache__"))
            task = load_task(root)
            src = root / task.spec.editable[0]
            build(task, Path(d) / "b")
            n = [0]

            def edit():
                n[0] += 1
                # code, not a comment: a comment after a one-file extension's last item changes neither half
                src.write_text(src.read_text() + f"\nstatic_assert({n[0]} > 0, \"edit {n[0]}\");\n")

            scan = timed(lambda: scan_task(task), reps * 3)
            passes = []
            prep = timed(lambda: (edit(), passes.append(expand(task))), reps)
            cold = timed(lambda: (_CACHE.clear(), edit(), expand(task)), reps)   # nothing kept (a run's first)
            alone = timed(lambda: (edit(), build(task, Path(d) / "b")), reps)

            def both():
                edit()
                with ThreadPoolExecutor(1) as pool:
                    f = pool.submit(expand, task)
                    build(task, Path(d) / "b")
                    ex = f.result()
                scan_expanded(ex.lines, root, units=ex.units)
            together = timed(both, reps)
            print(f"| {name} | {scan * 1e3:.1f} ms | {prep:.2f} s ({len(passes[-1].passes)}) | {cold:.2f} s | "
                  f"{alone:.2f} s | {together:.2f} s |")
            unread += [f"{name}: {why}" for why in passes[-1].failed]
    print("\n".join(["", "not read as compiled:"] + unread) if unread else "\nevery editable source was read as compiled")


if __name__ == "__main__":
    main()

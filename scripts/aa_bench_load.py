"""A/A benches of the CPU matmul under load: `python scripts/aa_bench_load.py RUNS BUSY`.

Starts BUSY spinning processes, then times the test kernel against a separately loaded copy of itself
and against torch's reference (tools.measure.bench.run_bench, the judge and its host) RUNS times; prints each
bench's status, its speedup over the copy (should be 1), the reference's median and the figure against
it. BENCHMARKS.md quotes it (torch's CPU threads, issue 37)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source  # noqa: E402
from tools.measure.bench import run_bench  # noqa: E402

SHAPE = {"M": 48, "N": 48, "K": 48}


def main() -> None:
    runs, busy = int(sys.argv[1]), int(sys.argv[2])
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory() as d:
            task, lib = make_task(Path(d), "correct")
            twin = compile_lib(source("correct"), Path(d) / "twin.so")
            for _ in range(runs):
                [r] = run_bench(task, lib, baseline_lib=twin, shapes=[SHAPE])
                ci, ref = r.speedup_vs_baseline, r.timing("reference")
                print(f"{r.status.value:10s} A/A {ci.median:.3f}x [{ci.low:.3f}, {ci.high:.3f}]  reference "
                      f"{ref.median_ms * 1e3:.1f} us (p90 {ref.p90_ms * 1e3:.1f})  {r.speedup_vs_reference:.3f}x vs "
                      f"reference  threads {getattr(r, 'threads', None)}", flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()

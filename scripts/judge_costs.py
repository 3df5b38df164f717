"""Two costs inside a judge, measured side by side on this machine (BENCHMARKS.md, "The test suite", the sixth session):

1. parity's compare of a 2^20-element float32 output against its float64 reference, on one CPU thread: with the
   quick pass (tools/measure/compare.py `_passes`) and with the full account alone, alternated, best of N each;
2. the CPU a fresh process spends on its first operation on torch's meta device (what an imported KernelBench task's
   empty_output did before 5ea25fc: it imports torch._dynamo) against the same operation on the CPU;
3. the CPU of the fork server's imports (tools/isolation/forkserver.py WARM) in a fresh process, with the garbage
   collector on (before 4b65db9) and off (the server now), alternated (the seventh session).

    python scripts/judge_costs.py [--rounds N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIRST_OP = ("import time, torch; x = torch.ones(256, 8192, device={dev!r}); t = time.process_time(); y = x * x + x; "
            "import sys; print(time.process_time() - t, 'torch._dynamo' in sys.modules)")


def compare_ms(rounds: int) -> dict[str, float]:
    import torch
    sys.path.insert(0, str(REPO))
    from tools.measure import compare as cmp
    torch.set_num_threads(1)
    exp = torch.randn(1 << 20, dtype=torch.float64)
    got = exp.float()
    quick = cmp._passes
    best = {"quick pass": 1e9, "full account": 1e9}
    for _ in range(rounds):
        for name, fn in (("quick pass", quick), ("full account", lambda *a: None)):
            cmp._passes = fn
            t = time.perf_counter()
            assert cmp.compare(got, exp, 1e-4, 1e-4)["status"] == "ok"
            best[name] = min(best[name], (time.perf_counter() - t) * 1e3)
    cmp._passes = quick
    return best


def first_op_cpu_s(device: str) -> str:
    r = subprocess.run([sys.executable, "-c", FIRST_OP.format(dev=device)], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() or r.stderr[-300:]


WARM_CPU = ("import gc, importlib, sys, time; sys.path.insert(0, {repo!r}); {gc}"
            "from tools.isolation.forkserver import WARM; t = time.process_time(); "
            "[importlib.import_module(m) for m in WARM]; print(round(time.process_time() - t, 3))")


def warm_cpu_s(collector: bool) -> str:
    code = WARM_CPU.format(repo=str(REPO), gc="" if collector else "gc.disable(); ")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() or r.stderr[-300:]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    for name, ms in compare_ms(a.rounds).items():
        print(f"compare, 2^20 float32 against float64, one thread, {name}: {ms:.1f} ms (best of {a.rounds})")
    for dev in ("meta", "cpu"):
        print(f"a fresh process's first operation on {dev}: CPU seconds, torch._dynamo imported: {first_op_cpu_s(dev)}")
    runs: dict[str, list[str]] = {"on": [], "off": []}
    for _ in range(3):
        for name in runs:
            runs[name].append(warm_cpu_s(name == "on"))
    for name, got in runs.items():
        print(f"the fork server's imports, the garbage collector {name}: CPU seconds {', '.join(got)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

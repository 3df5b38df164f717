"""Issue 66: what a values draw (tools/measure/domains.py draw: values:tiny, values:specials) costs on the lent GPU
machine, alone and beside the company a confirmation's parity has (a CPU-busy process, a GPU-busy one), with torch's
intra-op threads as they are, at one and at four. Measured because the draws took 0.08-0.32 s each in a kept
iteration's parity on an H200 (scripts/device/kept_walls.sh) against 0.03 s on a 2-core machine without a GPU. Then
what the draw holds, made on the card and on the CPU from the same inputs: its subnormals, its negative zeros, its
specials (a cast on the card that flushed subnormals to zero would empty values:tiny without a word).

    python3 scripts/device/draw_cost.py [REPEATS]     # from the repository root there; prints a table
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BUSY_CPU = "while True: pass"
BUSY_GPU = ("import torch\nx = torch.randn(4096, 4096, device='cuda')\n"
            "while True:\n    y = x @ x\n    torch.cuda.synchronize()\n")


def timed(task, shape, dist: str, n: int, threads: int | None) -> float:
    import torch

    from tools.measure.domains import draw
    was = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        secs = []
        for k in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            draw(task.spec, task.module(), shape, 1000 + k, "cuda", dist)
            torch.cuda.synchronize()
            secs.append(time.perf_counter() - t0)
        return statistics.median(secs)
    finally:
        torch.set_num_threads(was)


def main() -> None:
    import torch

    from tools.task import load_task
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cases = [("kernels/attention_fwd", {"B": 1, "H": 8, "S": 512, "D": 64, "causal": 0}, ("values:tiny",)),
             ("kernels/softmax", {"M": 2841, "N": 745}, ("values:tiny", "values:specials"))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, {torch.cuda.get_device_name()}")
    for company in ("alone", "cpu x16", "gpu"):
        procs = []
        if company == "cpu x16":
            procs = [subprocess.Popen([sys.executable, "-c", BUSY_CPU]) for _ in range(16)]
        elif company == "gpu":
            procs = [subprocess.Popen([sys.executable, "-c", BUSY_GPU])]
            time.sleep(8)
        try:
            for root, shape, dists in cases:
                task = load_task(Path(root))
                for dist in dists:
                    timed(task, shape, dist, 1, None)     # first use: the module's kernels loaded
                    row = [f"{timed(task, shape, dist, n, t) * 1e3:8.1f} ms" for t in (None, 1, 4)]
                    print(f"{company:8s} {task.spec.name:14s} {dist:16s} threads as is / 1 / 4: {' '.join(row)}",
                          flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    for root, shape, dists in cases:
        task = load_task(Path(root))
        for dist in dists:
            print(f"held    {task.spec.name:14s} {dist:16s} card: {held(task, shape, dist, 'cuda')}; "
                  f"cpu: {held(task, shape, dist, 'cpu')}", flush=True)


def held(task, shape, dist: str, device: str) -> str:
    """What the draw's float inputs hold, summed: elements, subnormals, negative zeros, infinities, NaNs."""
    import torch

    from tools.measure.domains import draw
    n = sub = negz = inf = nan = 0
    for x in draw(task.spec, task.module(), shape, 1000, device, dist):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            continue
        tiny = torch.finfo(x.dtype).tiny
        a = x.detach().double().abs()
        n += x.numel()
        sub += int(((a > 0) & (a < tiny)).sum())
        negz += int(((x == 0) & torch.signbit(x)).sum())
        inf += int(torch.isinf(x).sum())
        nan += int(torch.isnan(x).sum())
    return f"{n} elements, {sub} subnormal, {negz} -0, {inf} inf, {nan} nan"


if __name__ == "__main__":
    main()

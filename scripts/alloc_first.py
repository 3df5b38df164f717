"""Why repeat_speed's counted calls come after uncounted ones (tools/measure/probes.py): an honest kernel that
allocates its output per call, as every KernelBench solution does (torch::empty_like), pays for new pages on the
first calls after the process made new buffers, whichever inputs those calls read. CI's machine, where a page fault
is dear, made ew_cpu's first calls on fresh inputs 2.6x slower than repeats, three tries in a row: refused as a
memo. Run: python scripts/alloc_first.py; each line: ms per call and minor page faults per call, for the first
pass after new buffers and the passes after it, in both orders."""

from __future__ import annotations

import resource
import statistics
import time

import torch

N = 256 * 8192     # ew's bench shape: 8 MiB a tensor


def kernel(out, x, y):
    t = torch.empty_like(x)          # the solution's own output, then copied into the harness's (task_py.run)
    torch.mul(x, y, out=t)
    t.add_(y)
    out.copy_(t)


def timed(sets, outs) -> tuple[float, float]:
    faults0, ms = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
    for (x, y), o in zip(sets, outs):
        t0 = time.perf_counter()
        kernel(o, x, y)
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / len(sets)


def new_sets(k: int):
    return [(torch.randn(N), torch.randn(N)) for _ in range(k)], [torch.ones(N) for _ in range(k)]


def main() -> None:
    torch.set_num_threads(1)
    seen, seen_outs = new_sets(2)
    for _ in range(20):
        timed(seen, seen_outs)
    kept = []
    for order in ("fresh first", "repeats first") * 3:
        fresh, outs = new_sets(4)
        if order == "fresh first":
            a, b = timed(fresh, outs), timed(seen * 2, seen_outs * 2)
            print(f"{order:13}: fresh {a[0]:.2f} ms ({a[1]:.0f} faults/call), then repeats {b[0]:.2f} ms ({b[1]:.0f})")
        else:
            b, a = timed(seen * 2, seen_outs * 2), timed(fresh, outs)
            print(f"{order:13}: repeats {b[0]:.2f} ms ({b[1]:.0f} faults/call), then fresh {a[0]:.2f} ms ({a[1]:.0f})")
        kept.append((fresh, outs))    # the kernel's host keeps the buffers it was sent


if __name__ == "__main__":
    main()

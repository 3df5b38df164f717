"""The bench's clocks (child side), after triton's do_bench: warm-up and repetitions are time budgets
spent on whole reps. CUDA: one event pair per rep, the L2 flushed (a 256 MB buffer zeroed in the timed
stream, outside the pair) before each rep, one sync at the end. CPU: perf_counter_ns per call.
Python's cyclic garbage collector is off during a timed burst, as timeit has it: a full collection over
torch's objects takes 100-140 ms on the 2-core CI machine, and falling between two reps of a burst it
is time the judge's clock sees and the reps do not (the outside check's word for that is forgery)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time


@contextlib.contextmanager
def no_gc():
    """The cyclic collector off for a timed burst, as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

FLUSH_BYTES = 256 * 1024 * 1024
MIN_REPS, MAX_REPS = 5, 100_000


class CudaClock:
    """One event pair per rep, the L2 flushed before each rep outside the pair, one sync at the end."""

    def __init__(self, torch):
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def run(self, fn, n: int, offset: int = 0, before=None) -> list[float]:
        """n reps of fn(offset + i); before(offset + i), if given, runs before each rep, outside its pair."""
        t = self.torch
        starts = [t.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [t.cuda.Event(enable_timing=True) for _ in range(n)]
        with no_gc():
            for i in range(n):
                if before is not None:
                    before(offset + i)
                self.flush.zero_()
                starts[i].record()
                fn(offset + i)
                ends[i].record()
            t.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def rep_cost(self, fn, n: int = 3) -> float:
        """GPU milliseconds one rep really costs: the flush and the call (as triton's do_bench estimates
        it), so that the rep budgets are spent as budgeted. For a 40 us kernel the 256 MB flush costs
        more than the kernel: counting only the kernel makes a bench like softmax's take 2-3x its budget."""
        t = self.torch
        s, e = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        s.record()
        for i in range(n):
            self.flush.zero_()
            fn(i)
        e.record()
        t.cuda.synchronize()
        return s.elapsed_time(e) / n

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class CpuClock:
    def run(self, fn, n: int, offset: int = 0, before=None) -> list[float]:
        out = []
        with no_gc():
            for i in range(n):
                if before is not None:
                    before(offset + i)
                t0 = time.perf_counter_ns()
                fn(offset + i)
                out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    def rep_cost(self, fn, n: int = 3) -> float:
        return statistics.median(self.run(fn, n))

    def sync(self) -> None:
        pass


def reps(est_ms: float, budget_ms: float) -> int:
    return int(min(MAX_REPS, max(MIN_REPS, budget_ms / max(est_ms, 1e-4))))


def estimate_and_warm(clock, fn, warmup_ms: float) -> float:
    """Warm up for about warmup_ms; returns the cost of one rep (flush included) for the rep counts."""
    est = clock.rep_cost(fn)
    clock.run(fn, max(1, int(warmup_ms / max(est, 1e-4))))
    return clock.rep_cost(fn)


@contextlib.contextmanager
def one_torch_thread():
    """torch's intra-op work on one CPU thread for the block, then back to the count it had."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

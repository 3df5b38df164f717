"""Child of tools/batch.py: parity, then bench, of several libraries in one process.

    python -m tools._batch_child --task DIR --baseline-lib PATH --limit-s S [--screen] [--contexts JSON_FILE] LIB ...

Loads the task module and the baseline library once (the torch import and the CUDA context are
paid once per batch, not per library), then for each library in turn runs what the loop's evaluate
child runs: parity (`tools.parity.check`, hidden shapes, a fresh seed) and, if it passes,
the interleaved bench against the baseline on the main shape (`tools.bench.measure`).
With --screen: only a short timing of each library alone on the main shape (the bench's own output
spot checks included, no parity), to rank a huge space before the full checks of the fastest.
With --contexts (a JSON list, one launch context or null per library): first the static launch
check of the library's own plan (tools.runner.static_launch, as in the loop's evaluate child);
a library it rejects runs nothing on the GPU.

Output, as in tools/runner.py: fd 1 points at stderr before any generated code loads; one JSON
line per library goes to a private copy of stdout, flushed at once, so the parent keeps every
result written before a later library killed the process:

    {"i": K, "status": "ok" | "launch_rejected" | "parity_failed" | "bench_failed" | "timeout", ..., "stop": bool}
    {"fatal": MESSAGE}                       # the task or the baseline did not load; nothing ran

The child stops (exit 0, "stop": true) after a library that may have left the process unfit for
the next one: a CUDA error (the context may be poisoned), a write outside the output, or a hang.
A watchdog thread ends the process after --limit-s on one library, writing that library's line as
a timeout first: a hung kernel costs one configuration, not the rest of the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time

from tools.runner import load_lib, parity_then_bench, private_stdout, static_launch

# failures after which the process is not trusted with the next library
UNSAFE_PARITY = {"error", "crashed", "timeout", "out_of_bounds"}
UNSAFE_BENCH = {"error", "crashed", "timeout"}


class _Reporter:
    """Writes the result lines; its watchdog ends the process when one library runs past the limit."""

    def __init__(self, out, limit_s: float):
        self.out, self.limit_s = out, limit_s
        self.cv = threading.Condition()
        self.current: tuple[int, float] | None = None
        threading.Thread(target=self._watch, daemon=True).start()

    def write(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def start(self, i: int) -> None:
        with self.cv:
            self.current = (i, time.monotonic())
            self.cv.notify()

    def done(self, obj: dict) -> None:
        with self.cv:
            self.write(obj)
            self.current = None
            self.cv.notify()

    def _watch(self) -> None:
        with self.cv:
            while True:
                if self.current is None:
                    self.cv.wait()
                    continue
                i, t0 = self.current
                left = t0 + self.limit_s - time.monotonic()
                if left > 0:
                    self.cv.wait(left)
                    continue
                self.write({"i": i, "status": "timeout", "seconds": time.monotonic() - t0, "stop": True,
                            "message": f"parity and bench ran past {self.limit_s:.0f}s (the kernel hangs or is "
                                       "far too slow); the evaluation child was ended"})
                os._exit(0)


def _launch(task, mod, lib, ctx: dict | None, t0: float) -> tuple[dict, dict | None]:
    """The static launch check where a context was given: ({"launch": ...} or {}, the row that ends
    this library, or None to go on)."""
    if ctx is None:
        return {}, None
    launch = static_launch(task, mod, lib, ctx)
    if launch["status"] == "ok":
        return {"launch": launch}, None
    return {}, {"launch": launch, "status": "launch_rejected", "message": f"launch {launch['status']}: {launch['message']}",
                "stop": False, "seconds": time.monotonic() - t0}


def _one(task, mod, base, lib_path: str, ctx: dict | None = None) -> dict:
    from tools.results import ParityResult, ParityStatus
    t0 = time.monotonic()
    seed = secrets.randbits(31)
    bench, stage, launch = None, ["launch"], {}
    try:
        lib = load_lib(lib_path)
        launch, rejected = _launch(task, mod, lib, ctx, t0)
        if rejected is not None:
            return rejected
        stage[0] = "parity"
        parity, benches = parity_then_bench(task, mod, lib, base, seed=seed, shapes=[dict(task.spec.main)],
                                            mark=lambda st: stage.__setitem__(0, st))
        bench = benches[0] if benches else None
    except Exception as e:  # a library that does not load, a missing symbol: this library's failure
        if stage[0] == "bench":
            raise       # the harness failed in the bench: main() reports it and trusts nothing after
        msg = " ".join(str(e).split())[:500]
        parity = ParityResult(status=ParityStatus.error, message=f"parity could not run: {type(e).__name__}: {msg}")
    row = {**launch, "seed": seed, "parity": parity.model_dump(mode="json", exclude={"checks"})}
    if parity.status != ParityStatus.ok:
        return {**row, "status": "parity_failed", "message": f"parity {parity.status.value}: {parity.message}",
                "stop": parity.status.value in UNSAFE_PARITY, "seconds": time.monotonic() - t0}
    row["bench"] = bench.model_dump(mode="json")
    if bench.status.value != "ok":
        return {**row, "status": "bench_failed", "message": f"bench {bench.status.value}: {bench.message}",
                "stop": bench.status.value in UNSAFE_BENCH, "seconds": time.monotonic() - t0}
    return {**row, "status": "ok", "stop": False, "seconds": time.monotonic() - t0}


def _screen(task, mod, lib_path: str, ctx: dict | None = None) -> dict:
    """A short timing alone on the main shape: a ranking hint, never a reported result."""
    from tools.bench import measure
    from tools.task import Task
    t0 = time.monotonic()
    b = task.spec.bench
    quick = b.model_copy(update={"warmup_ms": min(b.warmup_ms, 5.0), "rep_ms": min(b.rep_ms, 20.0), "input_sets": 1})
    qtask = Task(task.spec.model_copy(update={"bench": quick}), task.root)
    try:
        lib = load_lib(lib_path)
    except Exception as e:
        msg = " ".join(str(e).split())[:500]
        return {"status": "bench_failed", "message": f"screen could not load the library: {type(e).__name__}: {msg}",
                "stop": False, "seconds": time.monotonic() - t0}
    launch, rejected = _launch(task, mod, lib, ctx, t0)
    if rejected is not None:
        return rejected
    bench = measure(qtask, mod, lib, baseline=None, shapes=[dict(task.spec.main)], with_reference=False)[0]
    row = {**launch, "bench": bench.model_dump(mode="json"), "seconds": time.monotonic() - t0}
    if bench.status.value != "ok":
        return {**row, "status": "bench_failed", "message": f"screen {bench.status.value}: {bench.message}",
                "stop": bench.status.value in UNSAFE_BENCH}
    return {**row, "status": "ok", "stop": False}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools._batch_child")
    ap.add_argument("--task", required=True)
    ap.add_argument("--baseline-lib", required=True)
    ap.add_argument("--limit-s", type=float, required=True, help="parity + bench of one library at most")
    ap.add_argument("--screen", action="store_true", help="a short timing of each library alone, no parity")
    ap.add_argument("--contexts", help="JSON file: a list of launch contexts (or null), one per library")
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args(argv)
    out = private_stdout()
    rep = _Reporter(out, a.limit_s)
    try:
        from tools.task import load_task
        task = load_task(a.task)
        mod = task.module()
        base = load_lib(a.baseline_lib)
        ctxs = json.loads(open(a.contexts).read()) if a.contexts else [None] * len(a.libs)
        if len(ctxs) != len(a.libs):
            raise ValueError(f"{len(ctxs)} launch contexts for {len(a.libs)} libraries")
    except Exception as e:
        rep.write({"fatal": f"the batch child could not start: {type(e).__name__}: {' '.join(str(e).split())[:500]}"})
        return 2
    for i, lib in enumerate(a.libs):
        rep.start(i)
        try:
            row = _screen(task, mod, lib, ctxs[i]) if a.screen else _one(task, mod, base, lib, ctxs[i])
        except Exception as e:  # the harness itself failed on this library: report it, trust nothing after
            msg = " ".join(str(e).split())[:500]
            row = {"status": "bench_failed", "message": f"evaluation failed: {type(e).__name__}: {msg}", "stop": True}
        rep.done({"i": i, **row})
        if row["stop"]:
            return 0
    return 0


if __name__ == "__main__":
    # before any candidate code is loaded: writes only in this process's scratch directory
    from tools.confine import fence_scratch
    fence_scratch()
    sys.exit(main())

"""Child of tools/judge/batch.py: parity, then bench, of several libraries, judged here, run in a host.

    python -m tools.judge._batch_child --task DIR --baseline-lib PATH --limit-s S [--screen | --parity-only] [--contexts JSON_FILE] LIB ...

A judge for a batch, as tools/judge/judge.py is for one candidate: this process loads the task module (the
reference) but never a library under test. It starts one host (tools/judge/host.py: fenced to its own
scratch directory, the only process that loads the libraries), has it load the baseline once, then for
each library in turn has it load the library and runs here what the loop's judge runs: parity
(`tools.measure.parity.check`, hidden shapes, a fresh seed; the inputs made here, the outputs compared here)
and, if it passes, the interleaved bench against the baseline on the main shape (`tools.measure.bench.measure`
over the host's runs, each burst timed here from outside). What a library does in the host cannot
reach the comparison, the probes, the statistics or the line this process writes.
With --screen: only a short timing of each library alone on the main shape (the bench's own output
spot checks included, no parity, no probe), to rank a huge space before the full checks of the fastest. The full
check leaves the reentrant probe and parity's seeds and range shapes after the first to the verification of the
sweep's best (SCREEN_LEAVES, FULL_LEAVES, FULL_PARITY).
With --parity-only: parity of each library, no bench (`agent check --knobs`).
With --contexts (a JSON list, one launch context or null per library): first the static launch
check of the library's own plan (the host answers the plan as data, tools.measure.launch judges it here);
a library it rejects runs nothing.

Output: one JSON line per library on a private copy of stdout, flushed at once, so the parent keeps
every result written before a later library killed the host (with --progress FILE, also appended to FILE, where
the parent reads each as it lands):

    {"i": K, "status": "ok" | "launch_rejected" | "parity_failed" | "bench_failed" | "timeout", ..., "stop": bool}
    {"fatal": MESSAGE}                       # the task, the host or the baseline did not load; nothing ran

The child stops (exit 0, "stop": true) after a library that may have left the host unfit for the next
one (a crash, a CUDA error, a write outside the output, a hang); the parent starts a fresh child, and so
a fresh host, for the rest. A watchdog thread ends the process (and with it the host) after --limit-s
on one library, writing that library's line as a timeout first.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

from tools.isolation.proctree import end_adopted, subreaper
from tools.judge.hostclient import HostClient, HostFailed, Remote
from tools.judge.hostruns import HostRuns
from tools.judge.judge import state_left, wrote_files
from tools.judge.runner import private_stdout
from tools.measure.probes import BEFORE_KEEP, PROBES

# What a batch leaves out, each to the later stage that runs it (issue 66: on an H200, of a softmax configuration's 1.8 s
# screen the reentrant probe took 1.4-1.6 s, the other probes 0.15 s, the timing 0.05 s; 1.9 s of a full check's 7 s).
# A screen is a ranking, never kept nor reported: a kernel that games its timer ranks itself into the full checks, which
# run every probe but the reentrant one; the best of a sweep, its answer, is verified with all (agent/sweep/run.py).
SCREEN_LEAVES = (PROBES, "a screen (the fastest get them in their full checks)")
FULL_LEAVES = (BEFORE_KEEP, "a sweep's full check (its best gets it in the verification)")
# A full check is what a candidate of the loop pays; the verification of the best, what a keep pays: parity's quick
# extent here (the listed and hidden shapes on the first seed), every seed and the range shapes there (on the H200,
# 2.5-3 s of a softmax configuration's 4-7 s). `agent check --knobs` (--parity-only) checks every extent.
FULL_PARITY = "quick"

# failures after which the process is not trusted with the next library
UNSAFE_PARITY = {"error", "crashed", "timeout", "out_of_bounds"}
UNSAFE_BENCH = {"error", "crashed", "timeout"}


class _Reporter:
    """Writes the result lines; its watchdog ends the process when one library runs past the limit."""

    def __init__(self, out, limit_s: float, progress=None):
        self.out, self.limit_s, self.progress = out, limit_s, progress
        self.cv = threading.Condition()
        self.current: tuple[int, float] | None = None
        self.watching = False

    def write(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()
        if self.progress is not None:       # the same line where the parent reads it as it lands (--progress)
            self.progress.write(json.dumps(obj) + "\n")
            self.progress.flush()

    def start(self, i: int) -> None:
        # the watchdog starts with the first library, not before: the host is forked from this process only while
        # it runs one thread (tools/judge/hostfork.py); with the watchdog already running, every batch started its
        # host afresh, a second Python and torch import (1.3-1.6 s of CPU a batch)
        if not self.watching:
            self.watching = True
            threading.Thread(target=self._watch, daemon=True).start()
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
                end_adopted(os.getpid(), set())   # the host and whatever this child adopted, before it goes
                os._exit(0)


def _launch(task, remote: Remote, ctx: dict | None, t0: float) -> tuple[dict, dict | None]:
    """The static launch check where a context was given: ({"launch": ...} or {}, the row that ends
    this library, or None to go on). The host answers the plan as data; tools.measure.launch judges it here."""
    from tools.measure.launch import from_context
    if ctx is None:
        return {}, None
    try:
        plan = remote.host.ask({"op": "plan", "lib": "candidate"})["plan"]
    except RuntimeError as e:
        plan = {"ok": False, "error": f"the host could not answer the launch plan: {e}"}
    res = from_context(task, plan, ctx)
    res.seconds = time.monotonic() - t0
    launch = res.model_dump(mode="json")
    if launch["status"] == "ok":
        return {"launch": launch}, None
    return {}, {"launch": launch, "status": "launch_rejected", "message": f"launch {launch['status']}: {launch['message']}",
                "stop": False, "seconds": time.monotonic() - t0}


def _load(remote: Remote, lib_path: str, t0: float, what: str) -> dict | None:
    """Have the host load the library as the candidate: None, or the row that ends this library."""
    try:
        remote.host.ask({"op": "load", "id": "candidate", "path": str(Path(lib_path).resolve())})
        return None
    except RuntimeError as e:   # the library did not load (a missing symbol): this library's failure
        msg = " ".join(str(e).split())[:500]
        from tools.results import ParityResult, ParityStatus
        row = {"status": "parity_failed" if what == "parity" else "bench_failed", "stop": False,
               "message": f"{what} could not load the library: {msg}", "seconds": time.monotonic() - t0}
        if what == "parity":
            row["parity"] = ParityResult(status=ParityStatus.error, message=row["message"]).model_dump(mode="json")
        return row


def _one(task, mod, remote: Remote, lib_path: str, ctx: dict | None = None, timed: bool = True) -> dict:
    from tools.measure.bench import measure
    from tools.measure.parity import check
    from tools.results import BenchStatus, ParityStatus
    t0 = time.monotonic()
    seed = secrets.randbits(31)
    mark = len(remote.host.state_left)          # what the libraries before this one left is theirs
    failed = _load(remote, lib_path, t0, "parity")
    if failed is not None:
        return {**failed, "seed": seed}
    launch, rejected = _launch(task, remote, ctx, t0)
    if rejected is not None:
        return rejected
    before = frozenset(remote.host.written())   # what the libraries before this one left in the host's directory
    parity = check(task, mod, "candidate", seed=seed, hidden=True, run=remote.run, run_kept=remote.run_kept,
                   extent="full" if not timed else FULL_PARITY)
    if parity.status == ParityStatus.ok and (why := wrote_files(remote.host, task, before)
                                             or state_left(remote.host, mark)) is not None:
        parity = parity.model_copy(update={"status": ParityStatus.side_effect, "message": why})
    row = {**launch, "seed": seed, "parity": parity.model_dump(mode="json", exclude={"checks"})}
    if parity.status != ParityStatus.ok:
        return {**row, "status": "crashed" if parity.status == ParityStatus.crashed else "parity_failed",
                "message": f"parity {parity.status.value}: {parity.message}",
                "stop": parity.status.value in UNSAFE_PARITY, "seconds": time.monotonic() - t0}
    if not timed:   # --parity-only
        return {**row, "status": "ok", "stop": False, "seconds": time.monotonic() - t0}
    bench = measure(task, mod, None, shapes=[dict(task.spec.main)], with_reference=False,
                    runs_for=lambda shape: HostRuns(remote, shape, True), left=FULL_LEAVES)[0]
    if bench.status.value == "ok" and (why := wrote_files(remote.host, task, before)
                                       or state_left(remote.host, mark)) is not None:
        bench = bench.model_copy(update={"status": BenchStatus.side_effect, "message": why})
    row["bench"] = bench.model_dump(mode="json")
    if bench.status.value != "ok":
        return {**row, "status": "crashed" if bench.status.value == "crashed" else "bench_failed",
                "message": f"bench {bench.status.value}: {bench.message}",
                "stop": bench.status.value in UNSAFE_BENCH, "seconds": time.monotonic() - t0}
    return {**row, "status": "ok", "stop": False, "seconds": time.monotonic() - t0}


def _screen(task, mod, remote: Remote, lib_path: str, ctx: dict | None = None) -> dict:
    """A short timing alone on the main shape: a ranking hint, never a reported result."""
    from tools.measure.bench import measure
    from tools.task import Task
    t0 = time.monotonic()
    b = task.spec.bench
    quick = b.model_copy(update={"warmup_ms": min(b.warmup_ms, 5.0), "rep_ms": min(b.rep_ms, 20.0), "input_sets": 1})
    qtask = Task(task.spec.model_copy(update={"bench": quick}), task.root)
    failed = _load(remote, lib_path, t0, "screen")
    if failed is not None:
        return failed
    launch, rejected = _launch(task, remote, ctx, t0)
    if rejected is not None:
        return rejected
    bench = measure(qtask, mod, None, shapes=[dict(task.spec.main)], with_reference=False,
                    runs_for=lambda shape: HostRuns(remote, shape, False), left=SCREEN_LEAVES)[0]
    row = {**launch, "bench": bench.model_dump(mode="json"), "seconds": time.monotonic() - t0}
    if bench.status.value != "ok":
        return {**row, "status": "crashed" if bench.status.value == "crashed" else "bench_failed",
                "message": f"screen {bench.status.value}: {bench.message}", "stop": bench.status.value in UNSAFE_BENCH}
    return {**row, "status": "ok", "stop": False}


def main(argv: list[str] | None = None) -> int:
    """A subreaper (issue 41): not forked by the fork server, this child would leave a kernel's double-forked daemon
    to init, past the kill of its tree; adopted here, it is ended with the batch."""
    subreaper()
    try:
        return _main(argv)
    finally:
        end_adopted(os.getpid(), set())


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.judge._batch_child")
    ap.add_argument("--task", required=True)
    ap.add_argument("--baseline-lib", required=True)
    ap.add_argument("--limit-s", type=float, required=True, help="parity + bench of one library at most")
    ap.add_argument("--screen", action="store_true", help="a short timing of each library alone, no parity")
    ap.add_argument("--parity-only", action="store_true", help="parity of each library, no bench")
    ap.add_argument("--contexts", help="JSON file: a list of launch contexts (or null), one per library")
    ap.add_argument("--progress", help="a file each result line is also appended to as it is written (opened here, "
                                       "before any host: the fenced host cannot open it, and keeps no descriptor)")
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args(argv)
    out = private_stdout()
    rep = _Reporter(out, a.limit_s, open(a.progress, "a") if a.progress else None)
    host = None
    try:
        from tools.task import load_task
        task = load_task(a.task)
        import torch  # noqa: F401  (here first: the host is forked from this process with it, HostClient)
        host = HostClient(task.root, Path(os.environ.get("AGENT_SCRATCH") or os.getcwd()))
        mod = task.module()
        task.backend.warm_up()
        remote = Remote(host)
        host.ask({"op": "load", "id": "baseline", "path": str(Path(a.baseline_lib).resolve())})
        ctxs = json.loads(open(a.contexts).read()) if a.contexts else [None] * len(a.libs)
        if len(ctxs) != len(a.libs):
            raise ValueError(f"{len(ctxs)} launch contexts for {len(a.libs)} libraries")
    except Exception as e:   # HostFailed included: the host did not start or load the baseline
        rep.write({"fatal": f"the batch child could not start: {type(e).__name__}: {' '.join(str(e).split())[:500]}"})
        if host is not None:
            host.close()
        return 2
    try:
        for i, lib in enumerate(a.libs):
            rep.start(i)
            try:
                row = (_screen(task, mod, remote, lib, ctxs[i]) if a.screen
                       else _one(task, mod, remote, lib, ctxs[i], timed=not a.parity_only))
            except HostFailed as e:   # the host died outside a stage's own handling (loading, the plan)
                row = {"status": "crashed" if e.status == "crashed" else "parity_failed", "message": str(e),
                       "stop": True, "parity": {"status": e.status, "message": str(e)}}
            except Exception as e:  # the harness itself failed on this library: report it, trust nothing after
                msg = " ".join(str(e).split())[:500]
                row = {"status": "bench_failed", "message": f"evaluation failed: {type(e).__name__}: {msg}", "stop": True}
            rep.done({"i": i, **row})
            if row["stop"]:
                return 0
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

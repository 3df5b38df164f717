"""Bench (DESIGN step 7): how fast is the candidate, against the current best and the reference?

After triton's do_bench (tools/backends/clocks.py): warm-up and repetitions are time budgets spent on whole
reps, the L2 flushed before each CUDA rep; median, p10, p90, mean. Inputs rotate among
`bench.input_sets` sets (two at least), filled with new values before each round.

With a baseline library and/or the reference, all are timed interleaved: `bench.rounds` rounds, each
timing the candidate, the baseline and the reference with the same rep count, the order rotated
round by round; the per-round medians give paired ratios (baseline/candidate, reference/candidate),
and each speedup is their median with a bootstrap 95% interval (fixed seed) over rounds. The
reference is timed inside the rounds because a figure "vs reference" taken alone, minutes apart
from the candidate, moves with whatever else the machine is doing (the same 256-cube reference took
0.24 ms in one run and 23 ms in the next, started while another process held one of two cores).

The rounds (tools/measure/rounds.py) are timed on values no call has seen: the sets refilled before each
round, two values of each input traded before each rep; their bursts are spot-checked at random.
After the timing, the probes (tools/measure/probes.py) cross-check that the timed calls did the work; a
probe that fails marks the result `suspicious`. Statistics are in tools/measure/stats.py, the clocks in
tools/backends/clocks.py, the one-child candidate check (launch plan, parity, bench) in tools/judge/candidate.py.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from tools.measure.probes import BEFORE_KEEP, PROBES, Probe, StreamSpan
from tools.measure.refcheck import settle
from tools.measure.rounds import EarlyStop, SpotCheck, interleaved
from tools.results import BenchResult, BenchStatus, DevicePeak, SpeedupCI
from tools.measure.roofline import spec_peak
from tools.backends.jitcache import judge_env
from tools.isolation.sandbox import ProcStatus, run_python_json
from tools.measure.stats import ci_text, claimed_arms, stats
from tools.task import Task, load_task, shape_label
from tools.task_messages import make_inputs


# --- parent side ----------------------------------------------------------------------------
def run_bench(task: Task, lib_path: Path, *, baseline_lib: Path | None = None, shapes: list[dict] | None = None,
              with_reference: bool = True, timeout_s: float | None = None,
              scratch_root: Path | None = None, rounds: int | None = None,
              confidence: float | None = None) -> list[BenchResult]:
    """Time the library at lib_path (one BenchResult per shape), in a child process. `rounds`, `confidence`: the
    bench's rounds and interval coverage instead of task.toml's (its timeout grows with the rounds)."""
    shapes = [dict(s) for s in (shapes or [task.spec.main])]
    args = ["bench", "--task", str(task.root), "--lib", str(Path(lib_path).resolve()), "--shapes", json.dumps(shapes)]
    if baseline_lib is not None:
        args += ["--baseline-lib", str(Path(baseline_lib).resolve())]
    if not with_reference:
        args.append("--no-reference")
    args += ["--rounds", str(rounds)] if rounds is not None else []
    args += ["--confidence", str(confidence)] if confidence is not None else []
    timeout = timeout_s if timeout_s is not None else task.spec.bench.timeout_for(rounds)
    t0 = time.monotonic()
    proc, data = run_python_json("tools.judge.judge", args, timeout, scratch_root, env=judge_env())
    dt = time.monotonic() - t0
    if proc.status == ProcStatus.ok and data is not None:
        try:
            return [BenchResult.model_validate(r) for r in data["results"]]
        except (KeyError, TypeError, ValueError) as e:
            msg = f"bench child answered malformed JSON: {e}"
            return [BenchResult(status=BenchStatus.error, message=msg, shape=s, seconds=dt) for s in shapes]
    return failed_bench(proc, data, shapes, dt)


def failed_bench(proc, data: dict | None, shapes: list[dict], dt: float, overrun: str | None = None) -> list[BenchResult]:
    """A bench child that did not answer: one typed result per shape."""
    from tools.measure.parity import child_failure
    status = {ProcStatus.timeout: BenchStatus.timeout, ProcStatus.crashed: BenchStatus.crashed}.get(
        proc.status, BenchStatus.error)
    msg = child_failure("bench", proc, data, overrun)
    return [BenchResult(status=status, message=msg, shape=s, seconds=dt) for s in shapes]


# --- child side -------------------------------------------------------------------------------
class LocalRuns:
    """The candidate, its baseline and the reference timed in this process (the sweep's batch child): the clock's word is taken. The judge's HostRuns (tools/judge/judge.py) is the
    same interface over a host process, with the judge's own clock around each burst."""

    def __init__(self, mod, lib, baseline, shape: dict, backend):
        self.mod, self.lib, self.baseline, self.shape = mod, lib, baseline, shape
        self.clock, self.gpu = backend.clock(), backend.gpu

    def arms(self, sets: list[tuple], outs: list, with_reference: bool) -> list[tuple[str, object]]:
        mod, shape, n = self.mod, self.shape, len(sets)
        timed_ref = getattr(mod, "timing_reference", mod.reference)
        arms = [("candidate", lambda i: mod.run(self.lib, shape, outs[i % n], *sets[i % n]))]
        if self.baseline is not None:   # the same buffers: identical code must time identically
            arms.append(("baseline", lambda i: mod.run(self.baseline, shape, outs[i % n], *sets[i % n])))
        if with_reference:
            arms.append(("reference", lambda i: timed_ref(shape, *sets[i % n])))
        return arms

    def calls(self, pairs: list[tuple], transfer: bool = True) -> tuple[float, float, float | None]:
        span = StreamSpan(self.gpu)
        self.clock.sync()
        t0 = time.perf_counter()
        with span:
            for out, inputs in pairs:
                self.mod.run(self.lib, self.shape, out, *inputs)
        t1 = time.perf_counter()
        self.clock.sync()
        ms = span.ms()
        return t1 - t0, time.perf_counter() - t0, (ms / 1e3 if ms is not None else None)

    def together(self, calls: list[tuple]) -> list[int]:
        """The candidate on each (thread, shape, out, inputs), thread 0's and 1's at once (ctypes lets go of
        the GIL), on a GPU each thread on a stream of its own. Returns the calls whose work outlived their stream."""
        from tools.measure.together import late_calls, two_threads
        outs = tuple([o for t, _, o, _ in calls if t == n] for n in (0, 1)) if self.gpu else None
        late = two_threads(tuple([lambda s=s, o=o, i=i: self.mod.run(self.lib, s, o, *i) for t, s, o, i in calls
                                  if t == n] for n in (0, 1)), outs)
        return late_calls([c[0] for c in calls], late)

    def time_pairs(self, sets: list[tuple], outs: list, n: int) -> list[float]:
        k = len(sets)
        return self.clock.run(lambda i: self.mod.run(self.lib, self.shape, outs[i % k], *sets[i % k]), n)

    def mirror(self, sets: list[tuple], seeds: list[int], dist: str) -> None:
        """The timed sets were filled with new values here (tools/measure/rounds.py): they are the same tensors."""
        self.clock.sync()

    def refreshed(self, sets: list[tuple], seed: int, offset: int, n: int) -> None:
        """A burst's per-rep copies were made on these very tensors: nothing to bring here."""
        self.clock.sync()

    def poison_outs(self, outs: list) -> None:
        from tools.measure.compare import poison_
        for o in outs:
            poison_(o)
        self.clock.sync()

    def fetch_outs(self, outs: list) -> None:
        self.clock.sync()     # they are here already

    def clock_check(self, claimed: set[str] | None = None) -> str | None:
        return None     # no clock outside this process to hold the bench to

    def clock_restart(self) -> None:
        pass

    def threads(self) -> int:
        import torch
        return torch.get_num_threads()

    def one_thread(self, fn, n: int) -> list[float]:
        """`fn` timed n times with torch on one CPU thread (tools/measure/refcheck.py: do its threads wait?)."""
        from tools.backends.clocks import one_torch_thread
        with one_torch_thread():
            return self.clock.run(fn, n)


def device_info(task: Task) -> tuple[str, DevicePeak | None]:
    device_name = task.backend.device_name()
    sp = spec_peak(device_name, task.spec.dtypes[0])
    return device_name, (DevicePeak(tflops=sp[0], gbps=sp[1], label=sp[2]) if sp else None)


def measure(task: Task, mod, lib, *, baseline=None, shapes: list[dict], with_reference: bool = True,
            runs_for=None, keep_gain: float | None = None, left: tuple[tuple, str] = ((), "")) -> list[BenchResult]:
    """Bench in this process (the child). One BenchResult per shape; never raises for the candidate.
    `runs_for(shape)` gives the runs to time (default LocalRuns of lib and baseline here). `keep_gain`: the loop's
    minimum gain, where the bench decides a keep (never_kept). `left`: (probes not run, why), said in the message (a
    sweep's ranking, its answer verified with all: tools/judge/_batch_child.py)."""
    backend = task.backend
    cuda = backend.gpu
    if (why := backend.runnable()) is not None:
        return [BenchResult(status=BenchStatus.error, message=why, shape=s) for s in shapes]
    device_name, peak = device_info(task)
    runs_for = runs_for or (lambda shape: LocalRuns(mod, lib, baseline, shape, backend))
    out: list[BenchResult] = []
    for i, shape in enumerate(shapes):
        t0 = time.monotonic()
        try:
            r = _bench_shape(task, mod, runs_for(shape), shape, with_reference, device_name, keep_gain, left)
        except Exception as e:
            msg = " ".join(str(e).split())[:400]
            r = BenchResult(status=getattr(e, "status", BenchStatus.error), shape=shape,
                            message=f"{shape_label(shape)}: {type(e).__name__}: {msg}")
            if cuda or hasattr(e, "status"):   # the context may be poisoned, the host is gone: stop
                r.device = device_name
                out.append(r)
                lost = getattr(e, "status", None)   # the host is gone: every shape left is lost with it
                out += [BenchResult(status=lost or BenchStatus.error, shape=s, message=(
                    f"not run: the host {lost} on an earlier shape ({r.message})" if lost else
                    "not run: an earlier shape hit a CUDA error (the context may be poisoned)")) for s in shapes[i + 1:]]
                return out
        r.device, r.seconds, r.peak = device_name, time.monotonic() - t0, peak
        out.append(r)
    return out


def never_kept(ci, keep_gain: float | None) -> str | None:
    """Why a candidate with this speedup over its baseline is never kept, or None: slower than it; or, given the loop's
    minimum gain, short of the keep rule (the interval above 1 and the median at 1 + gain; agent/evaluation/attempt.py decide
    applies this same function)."""
    if ci is None:
        return None
    if ci.high < 1.0:
        return "slower than the baseline"
    if keep_gain is not None and not (ci.low > 1.0 and ci.median >= 1.0 + keep_gain):
        return f"short of the {keep_gain:.0%} minimum gain over the baseline"
    return None


def _bench_shape(task, mod, runs, shape, with_reference, device_name="", keep_gain=None, left=((), "")) -> BenchResult:
    spec = task.spec
    b = spec.bench
    device = task.backend.torch_device
    t0, sysrng = time.monotonic(), random.SystemRandom()
    dist = spec.distributions[0]
    # two at least: a round's first call is also its cold one, so its second (the next set's first) is what
    # the round's repeats are held to (tools/measure/rounds.py)
    sets = [make_inputs(mod, shape, sysrng.getrandbits(31), device, dist) for _ in range(max(2, b.input_sets))]
    outs = [mod.empty_output(shape, *s) for s in sets]
    arms = runs.arms(sets, outs, with_reference)
    flops, nbytes = spec.flops(shape), spec.bytes(shape)
    spot = SpotCheck(task, mod, runs, shape, sets, outs, b.rounds, sysrng)
    early = EarlyStop(keep_gain, b.rounds) if keep_gain is not None else None
    phases = {"inputs": time.monotonic() - t0}   # then warm, rounds (interleaved) and again
    got, cis = interleaved(runs.clock, arms, b, spot, early, phases)
    t1, clock_why, retimed = time.monotonic(), runs.clock_check(claimed_arms(cis)), ""
    if clock_why is not None and spot.why is None:
        # The judge's clock and the host's disagreed: an honest host's can on a loaded machine (another
        # process takes the CPU between the host's reps and the judge's reads; .ci/run refused an honest
        # initial kernel so, two test workers and a third test run on 2 cores). A host that shaves its
        # times shaves them again: only figures from a bench whose clocks agree are reported.
        first = clock_why
        got, cis, clock_why = _again(runs, arms, b, spot, early)
        if clock_why is None:
            retimed = f"; timed twice, the first bench's clocks disagreed ({first})"
        else:
            clock_why += f" (the same in a second bench; the first: {first})"
    got, cis, more, unstable = settle(runs, arms, b, spot, lambda: _again(runs, arms, b, spot, early), got, cis,
                                      clock_why, task.backend.gpu)
    retimed += more
    phases["again"] = time.monotonic() - t1     # the clock check, and a second timing where it or settle asked one
    timings = [stats(label, got[label], flops, nbytes) for label, _ in arms]
    ci, ref_ci = cis.get("baseline"), (None if unstable else cis.get("reference"))
    cand_med = timings[0].median_ms
    vs_ref = ref_ci.median if ref_ci else None
    threads = runs.threads()
    on = f" (on {threads} CPU thread{'s' * (threads != 1)})" if threads and not task.backend.gpu else ""
    status, msg = BenchStatus.ok, (f"{shape_label(shape)}: candidate median {cand_med:.4g} ms"
                                   + (f", {ci.median:.3f}x vs baseline (95% CI {ci.low:.3f}-{ci.high:.3f})" if ci else "")
                                   + (f", {ci_text(ref_ci)} vs reference{on}" if ref_ci else "") + unstable + retimed
                                   + (early.why if early is not None else ""))
    why = clock_why or spot.why
    if why is not None:
        status, msg = BenchStatus.suspicious, why
    probe = Probe(task=task, mod=mod, shape=shape, device=device, device_name=device_name, calls=runs.calls,
                  sets=sets, outs=outs, cand_ms=cand_med, flops=flops, nbytes=nbytes, time_pairs=runs.time_pairs,
                  together=runs.together)
    never = never_kept(ci, keep_gain)   # the probes that matter only for a keep are left out
    msg += f"; {', '.join(c.__name__ for c in left[0])} probe{'s' * (len(left[0]) > 1)} not run: {left[1]}" if left[0] else ""
    cost: dict[str, float] = {}
    for check in (c for c in PROBES if c not in left[0]) if status == BenchStatus.ok else ():
        if never and check in BEFORE_KEEP:
            msg += f"; {check.__name__} probe not run: {never} (never kept)"
            continue
        t1 = time.monotonic()
        why = check(probe)
        cost[check.__name__] = round(time.monotonic() - t1, 3)
        if why is not None:
            status, msg = BenchStatus.suspicious, why
            break
    return BenchResult(status=status, message=msg, shape=shape, timings=timings, speedup_vs_baseline=ci,
                       speedup_vs_reference=vs_ref, speedup_vs_reference_ci=ref_ci, threads=threads, probe_seconds=cost,
                       phase_seconds={k: round(v, 3) for k, v in phases.items()})


def _again(runs, arms, b, spot, early: EarlyStop | None = None) -> tuple[dict[str, list[float]], dict[str, SpeedupCI],
                                                                       str | None]:
    """The whole bench timed once more, held to its own bursts: its times, intervals and clock check."""
    runs.clock_restart()
    if early is not None:
        early.why = ""
    got, cis = interleaved(runs.clock, arms, b, spot, early)
    return got, cis, runs.clock_check(claimed_arms(cis))


# --- CLI ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from tools.measure.parity import build_if_needed
    ap = argparse.ArgumentParser(prog="python -m tools.measure.bench", description="Time a kernel library: against a "
                                 "baseline library (interleaved, with a 95% CI) and the task's reference.")
    ap.add_argument("task", help="task folder, e.g. kernels/matmul_cpu")
    ap.add_argument("--lib", help="the compiled library (default: build the task's sources)")
    ap.add_argument("--baseline-lib", help="time against this library too (interleaved ABAB)")
    ap.add_argument("--shapes", help='JSON list of shapes (default: the main shape), e.g. \'[{"M":64,"N":64,"K":64}]\'')
    ap.add_argument("--all-shapes", action="store_true", help="bench every shape of task.toml")
    ap.add_argument("--no-reference", action="store_true", help="do not time the reference")
    ap.add_argument("--timeout", type=float, help="seconds (default: task.toml bench.timeout_s)")
    ap.add_argument("--json", action="store_true", help="print the BenchResults as JSON")
    a = ap.parse_args(argv)
    task = load_task(a.task)
    shapes = json.loads(a.shapes) if a.shapes else ([dict(s) for s in task.spec.shapes] if a.all_shapes else None)
    res = run_bench(task, build_if_needed(task, a.lib), baseline_lib=Path(a.baseline_lib) if a.baseline_lib else None,
                    shapes=shapes, with_reference=not a.no_reference, timeout_s=a.timeout)
    if a.json:
        print(json.dumps([r.model_dump(mode="json") for r in res], indent=2))
    else:
        _print(res)
    return 0 if all(r.status == BenchStatus.ok for r in res) else 1


def _print(results: list[BenchResult]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from tools.console import make_console
    con = make_console()
    for r in results:
        t = Table("timing", "median ms", "p10", "p90", "mean", "reps", "TFLOP/s", "GB/s",
                  title=escape(f"{shape_label(r.shape)}  {r.device}"))
        for s in r.timings:
            t.add_row(s.label, f"{s.median_ms:.4g}", f"{s.p10_ms:.4g}", f"{s.p90_ms:.4g}", f"{s.mean_ms:.4g}",
                      str(s.reps), f"{s.tflops:.3g}" if s.tflops else "-", f"{s.gbps:.3g}" if s.gbps else "-")
        if r.timings:
            con.print(t)
        color = "green" if r.status == BenchStatus.ok else "red"
        con.print(f"[{color}]{r.status.value}[/{color}] {escape(r.message)}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())

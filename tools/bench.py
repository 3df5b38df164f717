"""Bench (DESIGN step 7): how fast is the candidate, against the current best and the reference?

After triton's do_bench: warm-up and repetitions are time budgets, spent on whole reps (the
flush included, as triton estimates them); on CUDA the L2 is flushed (a 256 MB buffer zeroed in
the timed stream, outside the event pair) before each rep, one event pair per rep, one sync at the
end; median, p10, p90, mean. Inputs rotate among
`bench.input_sets` fresh sets. On the CPU each call is timed with perf_counter_ns.

With a baseline library the two are timed interleaved: `bench.rounds` rounds, each timing the
candidate and the baseline with the same rep count, alternating which goes first; the per-round
medians give paired ratios baseline/candidate, and the speedup is their median with a bootstrap
95% interval (fixed seed) over rounds.

Cross-checks that mark a result `suspicious`:
- after timing, the candidate runs on fresh inputs in the timed buffers, and in fresh buffers,
  poisoned, and must match the reference (a kernel that cheats on repeated calls fails here);
- CUDA: N back-to-back calls timed by wall clock with a device-wide sync; if the events say the
  kernel is more than 2x faster than that (and a call takes over 50 us of wall time, above launch
  overhead), work is running where the events do not see it (a side stream);
- burst (verification suite): BURST back-to-back calls, as the timing loop makes them, on fresh
  inputs into fresh poisoned buffers, every output checked (a kernel that detects a timing loop by
  the spacing or count of calls and skips the work fails here);
- roofline (verification suite, tools/roofline.py): a candidate median below the floor that the
  task's FLOP/byte formulas and the device's peaks allow did not do the work while timed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

from tools.results import (BenchResult, BenchStatus, LaunchResult, LaunchStatus, ParityResult, ParityStatus,
                           SpeedupCI, TimingStats)
from tools.sandbox import STAGE_MARK, Prestarted, ProcStatus, last_json, prestart_python, run_python_json
from tools.task import Task, load_task, shape_label

FLUSH_BYTES = 256 * 1024 * 1024
MIN_REPS, MAX_REPS = 5, 100_000
BOOTSTRAP = 2000
SIDE_STREAM_MIN_WALL_MS = 0.05
BURST = 3
BURST_REPEATS = 4


# --- parent side ----------------------------------------------------------------------------
def run_bench(task: Task, lib_path: Path, *, baseline_lib: Path | None = None, shapes: list[dict] | None = None,
              with_reference: bool = True, timeout_s: float | None = None) -> list[BenchResult]:
    """Time the library at lib_path (one BenchResult per shape), in a child process."""
    shapes = [dict(s) for s in (shapes or [task.spec.main])]
    args = ["bench", "--task", str(task.root), "--lib", str(Path(lib_path).resolve()), "--shapes", json.dumps(shapes)]
    if baseline_lib is not None:
        args += ["--baseline-lib", str(Path(baseline_lib).resolve())]
    if not with_reference:
        args.append("--no-reference")
    timeout = timeout_s if timeout_s is not None else task.spec.bench.timeout_s
    t0 = time.monotonic()
    proc, data = run_python_json("tools.runner", args, timeout)
    dt = time.monotonic() - t0
    if proc.status == ProcStatus.ok and data is not None:
        try:
            return [BenchResult.model_validate(r) for r in data["results"]]
        except (KeyError, TypeError, ValueError) as e:
            msg = f"bench child answered malformed JSON: {e}"
            return [BenchResult(status=BenchStatus.error, message=msg, shape=s, seconds=dt) for s in shapes]
    return _child_died(proc, data, shapes, dt)


def _child_died(proc, data: dict | None, shapes: list[dict], dt: float) -> list[BenchResult]:
    """A bench child that did not answer: one typed result per shape."""
    from tools.parity import child_failure
    status = {ProcStatus.timeout: BenchStatus.timeout, ProcStatus.crashed: BenchStatus.crashed}.get(
        proc.status, BenchStatus.error)
    msg = child_failure("bench", proc, data)
    return [BenchResult(status=status, message=msg, shape=s, seconds=dt) for s in shapes]


class CandidateChecks(NamedTuple):
    """What the evaluate child answered: each part None when an earlier one failed (or, for launch,
    when no launch context was given)."""
    launch: LaunchResult | None
    parity: ParityResult | None
    bench: list[BenchResult] | None


def prestart_candidate(task: Task) -> WarmChild:
    """The evaluate child of run_candidate, started now: its torch import and CUDA context overlap the
    candidate's build. Pass it to run_candidate, and close() it if the candidate never gets there."""
    return WarmChild(task, prestart_python("tools.runner", ["evaluate", "--task", str(task.root), "--no-reference",
                                                            "--job-stdin"]))


class WarmChild:
    """A pre-started evaluate child and what it loaded: it serves a task whose files are unchanged."""

    def __init__(self, task: Task, proc: Prestarted):
        self.root, self.stamp, self.proc = Path(task.root), _task_stamp(task), proc

    def serves(self, task: Task) -> bool:
        return (self.proc.alive and not self.proc.used and self.root == Path(task.root)
                and self.stamp == _task_stamp(task))

    def close(self) -> None:
        self.proc.close()


def _task_stamp(task: Task) -> tuple:
    """What the child loaded before its job: the task's spec and its Python files."""
    out = []
    for p in sorted(Path(task.root).glob("*.py")) + [Path(task.root) / "task.toml"]:
        try:
            st = p.stat()
            out.append((p.name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((p.name, None, None))
    return tuple(out)


def run_candidate(task: Task, lib_path: Path, baseline_lib: Path | None, *, seed: int | None = None,
                  shapes: list[dict] | None = None, launch_context: dict | None = None,
                  warm: WarmChild | None = None) -> CandidateChecks:
    """The loop's candidate check in ONE child process: with `launch_context` ({limits, kernels,
    parent}: see tools.launch.from_plan) the static launch check of the library's own plan, and
    nothing runs if it fails; then parity; then, only if it passed, the bench against the baseline.
    The same checks as tools.launch.static_check + run_parity + run_bench, two torch starts and two
    CUDA contexts fewer per iteration. A crash or timeout is charged to the stage the child had
    entered (it says so on stderr). `warm` (prestart_candidate) is used if it still serves this
    task's files, else a child is started here; either way it is spent."""
    import secrets

    from tools.parity import child_failure, child_status
    seed = secrets.randbits(31) if seed is None else seed
    shapes = [dict(s) for s in (shapes or [task.spec.main])]
    job = {"lib": str(Path(lib_path).resolve()), "seed": seed, "shapes": shapes, "launch_context": launch_context,
           "baseline_lib": str(Path(baseline_lib).resolve()) if baseline_lib is not None else None}
    timeout = task.spec.parity.timeout_s + task.spec.bench.timeout_s
    t0 = time.monotonic()
    if warm is None or not warm.serves(task):
        if warm is not None:
            warm.close()
        warm = prestart_candidate(task)   # started cold: the same child, given its job at once
    proc = warm.proc.run(json.dumps(job), timeout)
    data = last_json(proc.stdout)
    dt = time.monotonic() - t0
    if proc.status == ProcStatus.ok and data is not None:
        try:
            launch = None if data.get("launch") is None else LaunchResult.model_validate(data["launch"])
            par = None if data["parity"] is None else ParityResult.model_validate(data["parity"])
            bench = None if data["bench"] is None else [BenchResult.model_validate(r) for r in data["bench"]["results"]]
            return CandidateChecks(launch, par, bench)
        except (KeyError, TypeError, ValueError) as e:
            return CandidateChecks(None, ParityResult(status=ParityStatus.error, seconds=dt,
                                                      message=f"evaluate child answered malformed JSON: {e}"), None)
    lines = proc.stderr.splitlines()
    marks = [ln[len(STAGE_MARK):].strip() for ln in lines if ln.startswith(STAGE_MARK)]
    proc = proc.model_copy(update={"stderr": "\n".join(ln for ln in lines if not ln.startswith(STAGE_MARK))})
    stage = marks[-1] if marks else "parity"
    # the stages before the one that died passed in this child; their details were never printed
    lost = "ok (its details were lost when the child died in a later stage)"
    launch_ok = (LaunchResult(status=LaunchStatus.ok, message=lost) if launch_context is not None else None)
    if stage == "launch":
        return CandidateChecks(LaunchResult(status=LaunchStatus.error, seconds=dt,
                                            message=child_failure("launch plan", proc, data)), None, None)
    if stage == "bench":
        return CandidateChecks(launch_ok, ParityResult(status=ParityStatus.ok, message=lost, seconds=dt),
                               _child_died(proc, data, shapes, dt))
    return CandidateChecks(launch_ok, ParityResult(status=child_status(proc.status), seconds=dt,
                                                   message=child_failure("parity", proc, data)), None)


# --- statistics -------------------------------------------------------------------------------
def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(label: str, times_ms: list[float], flops: float | None, nbytes: float | None) -> TimingStats:
    med = statistics.median(times_ms)
    return TimingStats(label=label, median_ms=med, p10_ms=quantile(times_ms, 0.1), p90_ms=quantile(times_ms, 0.9),
                       mean_ms=statistics.fmean(times_ms), reps=len(times_ms),
                       tflops=flops / (med * 1e-3) / 1e12 if flops and med > 0 else None,
                       gbps=nbytes / (med * 1e-3) / 1e9 if nbytes and med > 0 else None)


def speedup_ci(ratios: list[float], confidence: float = 0.95, seed: int = 20261121) -> SpeedupCI:
    """Median of paired per-round ratios with a 95% interval (deterministic).

    The interval is the percentile bootstrap of the median, widened where needed to the
    distribution-free order-statistic interval of the median (binomial): with 8-10 rounds the
    bootstrap alone covers only about 93% (it spans roughly the 2nd to the 7th of 8 values), and an
    interval that undercovers would let noise pass as a speedup.
    """
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP))
    a = (1 - confidence) / 2
    lo, hi = order_stat_interval(sorted(ratios), confidence)
    return SpeedupCI(median=statistics.median(ratios), low=min(quantile(meds, a), lo),
                     high=max(quantile(meds, 1 - a), hi), confidence=confidence, rounds=len(ratios))


def order_stat_interval(xs: list[float], confidence: float) -> tuple[float, float]:
    """(x_k, x_{n-k+1}) with the largest k whose coverage of the median, 1 - 2 P(Bin(n, 1/2) < k), is
    at least `confidence` (k = 1, the full range, when no k reaches it)."""
    n = len(xs)
    k, cdf = 1, 0.0
    for j in range(1, n // 2 + 1):
        cdf += math.comb(n, j - 1) / 2 ** n       # P(Bin < j)
        if 1 - 2 * cdf < confidence:
            break
        k = j
    return xs[k - 1], xs[n - k]


# --- clocks (child side) --------------------------------------------------------------------
class CudaClock:
    """One event pair per rep, the L2 flushed before each rep outside the pair, one sync at the end."""

    def __init__(self, torch):
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def run(self, fn, n: int, offset: int = 0) -> list[float]:
        t = self.torch
        starts = [t.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [t.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            self.flush.zero_()
            starts[i].record()
            fn(offset + i)
            ends[i].record()
        t.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def rep_cost(self, fn, n: int = 3) -> float:
        """GPU milliseconds one rep really costs: the flush and the call (as triton's do_bench estimates
        it), so that the rep budgets are spent as budgeted. For a 40 us kernel the 256 MB flush costs
        more than the kernel: counting only the kernel made softmax's bench take 2-3x its budget."""
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
    def run(self, fn, n: int, offset: int = 0) -> list[float]:
        out = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            fn(offset + i)
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    def rep_cost(self, fn, n: int = 3) -> float:
        return statistics.median(self.run(fn, n))

    def sync(self) -> None:
        pass


def _reps(est_ms: float, budget_ms: float) -> int:
    return int(min(MAX_REPS, max(MIN_REPS, budget_ms / max(est_ms, 1e-4))))


def _estimate_and_warm(clock, fn, warmup_ms: float) -> float:
    """Warm up for about warmup_ms; returns the cost of one rep (flush included) for the rep counts."""
    est = clock.rep_cost(fn)
    clock.run(fn, max(1, int(warmup_ms / max(est, 1e-4))))
    return clock.rep_cost(fn)


# --- child side -------------------------------------------------------------------------------
def measure(task: Task, mod, lib, *, baseline=None, shapes: list[dict], with_reference: bool = True
            ) -> list[BenchResult]:
    """Bench in this process (the child). One BenchResult per shape; never raises for the candidate."""
    import torch
    cuda = task.spec.device == "cuda"
    if cuda and not torch.cuda.is_available():
        return [BenchResult(status=BenchStatus.error, message="the task needs CUDA but no GPU is visible", shape=s)
                for s in shapes]
    device_name = f"cuda: {torch.cuda.get_device_name()}" if cuda else "cpu"
    clock = CudaClock(torch) if cuda else CpuClock()
    out: list[BenchResult] = []
    for i, shape in enumerate(shapes):
        t0 = time.monotonic()
        try:
            r = _bench_shape(task, mod, lib, baseline, shape, with_reference, clock, torch, cuda, device_name)
        except Exception as e:
            msg = " ".join(str(e).split())[:400]
            r = BenchResult(status=BenchStatus.error, message=f"{shape_label(shape)}: {type(e).__name__}: {msg}",
                            shape=shape)
            if cuda:   # the context may be poisoned: the other shapes are not run
                r.device = device_name
                out.append(r)
                out += [BenchResult(status=BenchStatus.error, shape=s, message="not run: an earlier shape hit a "
                                    "CUDA error (the context may be poisoned)") for s in shapes[i + 1:]]
                return out
        r.device, r.seconds = device_name, time.monotonic() - t0
        out.append(r)
    return out


def _bench_shape(task, mod, lib, baseline, shape, with_reference, clock, torch, cuda, device_name="") -> BenchResult:
    from tools.parity import compare, describe, dtype_name, poison_, tolerance_for
    from tools.roofline import floor_ms
    spec = task.spec
    b = spec.bench
    device = "cuda" if cuda else "cpu"
    sysrng = random.SystemRandom()
    dist = spec.distributions[0]
    sets = [tuple(mod.make_inputs(shape, sysrng.getrandbits(31), device, dist)) for _ in range(b.input_sets)]
    n_sets = len(sets)
    outs_c = [mod.empty_output(shape, *s) for s in sets]
    outs_b = outs_c     # the same buffers for both: identical code must time identically

    def cand(i):
        mod.run(lib, shape, outs_c[i % n_sets], *sets[i % n_sets])

    def base(i):
        mod.run(baseline, shape, outs_b[i % n_sets], *sets[i % n_sets])

    # "vs PyTorch" times what a PyTorch user would call (e.g. fp16 SDPA), which may differ from the
    # parity reference (computed in higher precision for the truth)
    timed_ref = getattr(mod, "timing_reference", mod.reference)

    def ref(i):
        timed_ref(shape, *sets[i % n_sets])

    flops, nbytes = spec.flops(shape), spec.bytes(shape)
    est_c = _estimate_and_warm(clock, cand, b.warmup_ms)
    timings: list[TimingStats] = []
    ci = None
    if baseline is not None:
        est_b = _estimate_and_warm(clock, base, b.warmup_ms)
        n = _reps(max(est_c, est_b), b.rep_ms)
        all_c, all_b, ratios = [], [], []
        for r in range(b.rounds):
            order = [("c", cand), ("b", base)] if r % 2 == 0 else [("b", base), ("c", cand)]
            got = {k: clock.run(fn, n, offset=r * n) for k, fn in order}
            all_c += got["c"]
            all_b += got["b"]
            ratios.append(statistics.median(got["b"]) / max(statistics.median(got["c"]), 1e-9))
        timings += [stats("candidate", all_c, flops, nbytes), stats("baseline", all_b, flops, nbytes)]
        ci = speedup_ci(ratios)
    else:
        timings.append(stats("candidate", clock.run(cand, _reps(est_c, b.rep_ms)), flops, nbytes))
    cand_med = timings[0].median_ms
    vs_ref = None
    if with_reference:
        est_r = _estimate_and_warm(clock, ref, b.warmup_ms)
        t_ref = stats("reference", clock.run(ref, _reps(est_r, b.rep_ms)), flops, nbytes)
        timings.append(t_ref)
        vs_ref = t_ref.median_ms / cand_med if cand_med > 0 else None
    status, msg = BenchStatus.ok, (f"{shape_label(shape)}: candidate median {cand_med:.4g} ms"
                                   + (f", {ci.median:.3f}x vs baseline (95% CI {ci.low:.3f}-{ci.high:.3f})" if ci else "")
                                   + (f", {vs_ref:.3f}x vs reference" if vs_ref else ""))

    # spot checks: fresh inputs in the buffers of the latest call (pointer-keyed caches go stale), then
    # fresh buffers
    cand(0)
    clock.sync()
    fresh = tuple(mod.make_inputs(shape, sysrng.getrandbits(31), device, spec.distributions[-1]))
    for x, y in zip(sets[0], fresh):
        x.copy_(y)
    probes = [(sets[0], outs_c[0], "the timed buffers")]
    fresh2 = tuple(mod.make_inputs(shape, sysrng.getrandbits(31), device, dist))
    probes.append((fresh2, mod.empty_output(shape, *fresh2), "fresh buffers"))
    for inputs, o, where in probes:
        poison_(o)
        clock.sync()
        mod.run(lib, shape, o, *inputs)
        clock.sync()
        exp = mod.reference(shape, *inputs)
        atol, rtol = tolerance_for(task, o)
        c = compare(o, exp, atol, rtol)
        if c["status"] != "ok":
            line = c.get("message") or describe(shape_label(shape), spec.distributions[-1], c, atol, rtol)
            return BenchResult(status=BenchStatus.suspicious, shape=shape, timings=timings, speedup_vs_baseline=ci,
                               speedup_vs_reference=vs_ref,
                               message=f"after timing, the candidate was wrong on fresh inputs in {where} "
                                       f"({c['status']}): {line}")

    # burst (verification suite): back-to-back calls like the timing loop's, each into its own poisoned
    # buffer with its own fresh inputs; every output must be right. BURST_REPEATS bursts, fresh poisoned
    # buffers each time: on a loaded CPU a single burst's calls can come too far apart to look like a
    # timing loop to a kernel that watches the gap (seen on a 2-core machine under load)
    for rep in range(BURST_REPEATS):
        # fresh inputs each time: the burst probes timing-loop detection, not input caches (those are
        # parity's and the roofline's)
        burst = [tuple(mod.make_inputs(shape, sysrng.getrandbits(31), device, dist)) for _ in range(BURST)]
        expected = [mod.reference(shape, *x) for x in burst]
        bouts = [mod.empty_output(shape, *x) for x in burst]
        for o in bouts:
            poison_(o)
        clock.sync()
        for x, o in zip(burst, bouts):
            mod.run(lib, shape, o, *x)
        clock.sync()
        for k, (o, exp) in enumerate(zip(bouts, expected)):
            atol, rtol = tolerance_for(task, o)
            c = compare(o, exp, atol, rtol)
            if c["status"] != "ok":
                line = describe(shape_label(shape), dist, c, atol, rtol)
                return BenchResult(status=BenchStatus.suspicious, shape=shape, timings=timings,
                                   speedup_vs_baseline=ci, speedup_vs_reference=vs_ref,
                                   message=f"in {BURST} calls back to back (as the timing loop makes them; burst "
                                           f"{rep + 1} of {BURST_REPEATS}), call {k + 1} was wrong ({c['status']}): "
                                           f"{line}")
        del bouts, burst, expected

    # roofline (verification suite): faster than the hardware allows = the timed calls skipped the work
    fl = floor_ms(flops, nbytes, device_name or ("cuda" if cuda else "cpu"), dtype_name(outs_c[0]))
    if fl is not None and cand_med < fl.ms:
        return BenchResult(status=BenchStatus.suspicious, shape=shape, timings=timings, speedup_vs_baseline=ci,
                           speedup_vs_reference=vs_ref,
                           message=f"{shape_label(shape)}: candidate median {cand_med * 1e3:.3g} us is below the "
                                   f"{fl.describe()}: the timed calls cannot have done the work")

    if cuda:
        n_wall = max(10, min(1000, int(50 / max(cand_med, 1e-3))))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n_wall):
            cand(i)
        t_host = time.perf_counter()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        wall_ms, host_ms = (t1 - t0) * 1e3 / n_wall, (t_host - t0) * 1e3 / n_wall
        if wall_ms > SIDE_STREAM_MIN_WALL_MS and wall_ms > 2 * max(cand_med, host_ms):
            status = BenchStatus.suspicious
            msg = (f"{shape_label(shape)}: events say {cand_med * 1e3:.1f} us per call but back-to-back calls with a "
                   f"device-wide sync take {wall_ms * 1e3:.1f} us each: work runs outside the timed stream")
    return BenchResult(status=status, message=msg, shape=shape, timings=timings, speedup_vs_baseline=ci,
                       speedup_vs_reference=vs_ref)


# --- CLI ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from tools.parity import build_if_needed
    ap = argparse.ArgumentParser(prog="python -m tools.bench", description="Time a kernel library: against a "
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
    from rich.console import Console
    from rich.table import Table
    con = Console()
    for r in results:
        t = Table("timing", "median ms", "p10", "p90", "mean", "reps", "TFLOP/s", "GB/s",
                  title=f"{shape_label(r.shape)}  {r.device}")
        for s in r.timings:
            t.add_row(s.label, f"{s.median_ms:.4g}", f"{s.p10_ms:.4g}", f"{s.p90_ms:.4g}", f"{s.mean_ms:.4g}",
                      str(s.reps), f"{s.tflops:.3g}" if s.tflops else "-", f"{s.gbps:.3g}" if s.gbps else "-")
        if r.timings:
            con.print(t)
        color = "green" if r.status == BenchStatus.ok else "red"
        con.print(f"[{color}]{r.status.value}[/{color}] {r.message}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())

"""Bench with real compiled CPU kernels through the real child process: the speedup interval must
contain 1 for a kernel against itself, exclude 1 the right way for a slowed copy, and the
post-timing spot check must flag kernels that cheat on repeated calls."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tools.measure.bench import run_bench
from tools.measure.stats import quantile, speedup_ci, stats
from tools.results import BenchStatus
from tools.task import load_task

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
SHAPE = {"M": 48, "N": 48, "K": 48}


def test_statistics_and_bootstrap_interval():
    xs = [float(x) for x in range(1, 11)]
    assert quantile(xs, 0.5) == 5.5 and quantile(xs, 0.1) == pytest.approx(1.9) and quantile(xs, 0.0) == 1.0
    s = stats("candidate", xs, flops=2e9, nbytes=1e9)
    assert s.median_ms == 5.5 and s.reps == 10 and s.mean_ms == 5.5
    assert s.tflops == pytest.approx(2e9 / 5.5e-3 / 1e12) and s.gbps == pytest.approx(1e9 / 5.5e-3 / 1e9)
    ci = speedup_ci([1.9, 2.0, 2.1, 2.0, 1.95, 2.05])
    assert ci.low > 1.8 and ci.high < 2.2 and ci.low <= ci.median <= ci.high and ci.excludes_one()
    assert speedup_ci([1.9, 2.0, 2.1, 2.0, 1.95, 2.05]) == ci          # deterministic
    flat = speedup_ci([0.99, 1.01, 1.0, 0.98, 1.02, 1.0])
    assert not flat.excludes_one()
    # 10 rounds: the interval is at least (2nd, 9th) of the sorted ratios (coverage 97.9% >= 95%)
    ten = speedup_ci([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9])
    assert ten.low <= 1.1 and ten.high >= 1.8 and ten.rounds == 10


def test_a_timed_burst_runs_without_the_cyclic_collector_and_gives_it_back():
    import gc

    from tools.backends.clocks import CpuClock
    seen = []
    assert gc.isenabled()
    ts = CpuClock().run(lambda i: seen.append(gc.isenabled()), 20)
    assert len(ts) == 20 and seen == [False] * 20 and gc.isenabled()
    gc.disable()          # a caller that had it off keeps it off
    try:
        CpuClock().run(lambda i: None, 3)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_kernel_against_itself_has_an_interval_containing_one(tmp_path):
    task, lib = make_task(tmp_path, "correct")
    twin = compile_lib(source("correct"), tmp_path / "twin.so")     # same code, a separately loaded copy
    # a 95% interval misses the truth now and then by design (here at most 2/256 of runs, all 8
    # rounds on one side); a second attempt makes a false failure ~1e-4, while a real bias fails twice
    for _attempt in range(2):
        [r] = run_bench(task, lib, baseline_lib=twin, shapes=[SHAPE])
        assert r.status == BenchStatus.ok, r.message
        ci = r.speedup_vs_baseline
        # a loaded machine (the other test worker's compiles) widens the interval around a median that strays: .ci/run
        # at e5b5cd1 found an interval holding 1 around a median of 0.89 on its one attempt; such a run gets a second
        if ci is not None and ci.low <= 1.0 <= ci.high and 0.9 < ci.median < 1.1:
            break
    # Two loads of one kernel can differ for real by a fraction of a percent (where each copy's code and
    # data land: a fresh clone's CI found [1.0019, 1.034] twice, median 1.004); a tight interval then
    # excludes 1 honestly. What must hold is that no decision acts on it: within the keep rule's 2%.
    assert ci is not None and ci.rounds == 8 and (ci.low <= 1.0 <= ci.high or abs(ci.median - 1.0) < 0.02), ci
    assert 0.9 < ci.median < 1.1
    cand, base, ref = r.timing("candidate"), r.timing("baseline"), r.timing("reference")
    assert cand.reps == base.reps and cand.reps >= 8 * 5                # same rep count per side, every round
    assert cand.p10_ms <= cand.median_ms <= cand.p90_ms and cand.tflops > 0 and cand.gbps > 0
    # the reference is timed inside the same rounds (same rep count), its speedup a paired median with a CI
    rci = r.speedup_vs_reference_ci
    assert ref is not None and ref.reps == cand.reps and rci is not None and rci.rounds == 8
    assert r.speedup_vs_reference == rci.median and rci.low <= rci.median <= rci.high
    # the paired median of per-round ratios against the ratio of pooled medians: the same quantity, two
    # estimators; torch's threaded matmul on 2 busy cores moves between rounds, so they agree within a
    # factor, not 10% (1 run in 5 differed by 13-47%). The factor still tells ref/cand from cand/ref (~25x apart).
    assert 1 / 1.6 < r.speedup_vs_reference / (ref.median_ms / cand.median_ms) < 1.6
    assert r.shape == SHAPE and r.device == "cpu"
    # a CPU task's default: torch on one thread in the host, said beside the figure against it
    assert r.threads == 1 and re.search(r"[\d.]+x \[[\d.]+, [\d.]+\] vs reference \(on 1 CPU thread\)", r.message), r.message


def test_the_tasks_cpu_threads_are_set_in_the_host_and_for_the_kernels_runtimes(tmp_path):
    """cpu_threads is what torch runs the reference on in the host (its own word, reported in the
    result), and what an OpenMP, MKL or OpenBLAS runtime the kernel's library starts reads."""
    task, lib = make_task(tmp_path, "correct")
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace('device = "cpu"\n', 'device = "cpu"\ncpu_threads = 3\n'))
    task = load_task(task.root)
    assert task.backend.threads == 3
    [r] = run_bench(task, lib, shapes=[SHAPE], with_reference=True)
    # 3 threads on a 2-core machine can wait on each other (a 48-cube matmul: 86 us a call, 4.5 us on
    # one thread): no figure then (tools/measure/refcheck.py), and the message says why
    assert r.status == BenchStatus.ok and r.threads == 3, r.message
    if "on 3 CPU threads and" in r.message:
        few_cores = len(os.sched_getaffinity(0)) < 3
        assert ("more threads than the" in r.message) == few_cores and r.speedup_vs_reference is None, r.message
    else:
        assert "(on 3 CPU threads)" in r.message and r.speedup_vs_reference is not None, r.message
    probe = ("import os, sys, torch; from tools.task import load_task; load_task(sys.argv[1]).backend.warm_up(); "
             "print(torch.get_num_threads(), *(os.environ[v] for v in "
             "('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    got = subprocess.run([sys.executable, "-c", probe, str(task.root)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert got.stdout.split() == ["3"] * 4, got.stderr
    # a GPU task keeps torch's own count unless it says otherwise
    gpu = load_task(REPO / "kernels" / "softmax")
    assert gpu.spec.device == "cuda" and gpu.spec.cpu_threads is None and gpu.backend.threads is None


def test_slowed_copy_is_slower_with_an_interval_below_one(tmp_path):
    task, lib = make_task(tmp_path, "correct")
    slow = compile_lib(source("slowed"), tmp_path / "slowed.so")
    # with 8 rounds the 95% interval is the whole range of the rounds' ratios (tools/measure/stats.py), so one
    # round that a burst of load hit (a fresh clone's CI saw [0.397, 1.002], median 0.502) reaches
    # past 1; as in the A/A test, a second bench decides, and a kernel that is not slower fails both
    for _attempt in range(2):
        [r] = run_bench(task, slow, baseline_lib=lib, shapes=[SHAPE], with_reference=False)
        assert r.status == BenchStatus.ok, r.message
        ci = r.speedup_vs_baseline
        if ci.high < 1.0:
            break
    assert ci.high < 1.0 and 0.35 < ci.median < 0.7, ci               # twice the work: about 0.5x
    assert r.timing("reference") is None and r.speedup_vs_reference is None


@pytest.mark.parametrize("kernel, words", [
    ("counter", "mismatch"),        # right on the first call only: its timed calls were garbage
    ("ptrcache", "unwritten"),      # skips the work when handed an output pointer it has seen
])
def test_kernel_that_cheats_on_repeated_calls_is_suspicious(tmp_path, kernel, words):
    task, lib = make_task(tmp_path, kernel)
    [r] = run_bench(task, lib, shapes=[SHAPE], with_reference=False)
    # caught by the timed rounds' spot check (the poison its skipped calls left) or, after, by the probe
    assert r.status == BenchStatus.suspicious and words in r.message, r.message
    assert "timed round" in r.message or "fresh inputs" in r.message, r.message
    assert r.timing("candidate") is not None                              # the timings are still reported


def test_bench_crash_and_default_shape(tmp_path):
    task, lib = make_task(tmp_path, "segv")
    res = run_bench(task, lib, shapes=[SHAPE, {"M": 5, "N": 6, "K": 7}])
    assert [r.status for r in res] == [BenchStatus.crashed] * 2 and "SIGSEGV" in res[0].message
    assert [r.shape for r in res] == [SHAPE, {"M": 5, "N": 6, "K": 7}]


def test_a_bench_whose_task_no_longer_loads_says_why_for_each_shape(tmp_path):
    task, lib = make_task(tmp_path, "correct")
    (task.root / "task.toml").write_text("name = [unclosed\n")     # changed on disk after the agent loaded it
    res = run_bench(task, lib, shapes=[SHAPE, {"M": 5, "N": 6, "K": 7}])
    assert [r.status for r in res] == [BenchStatus.error] * 2, res
    assert [r.shape for r in res] == [SHAPE, {"M": 5, "N": 6, "K": 7}]
    assert all("bench could not run" in r.message and "task.toml" in r.message for r in res), res[0].message


def _crash_after(calls: int) -> str:
    """The correct kernel, which segfaults from its `calls`-th call on (parity makes a few dozen calls: 70-77 on the
    48^3 shape, counted; the bench hundreds to thousands, fewer on a loaded machine)."""
    text = source("correct").replace('extern "C" void matmul(', "static void matmul_ok(")
    return text + ('\n#include <csignal>\nstatic int g_calls = 0;\n'
                   'extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {\n'
                   f'    if (++g_calls >= {calls}) std::raise(SIGSEGV);\n'
                   '    matmul_ok(A, B, C, M, N, K);\n}\n')


@pytest.mark.parametrize("prestarted", [False, True], ids=["cold", "prestarted"])
def test_candidate_checks_share_one_child_and_a_crash_is_charged_to_its_stage(tmp_path, prestarted):
    from tools.judge.candidate import prestart_candidate, run_candidate
    from tools.results import ParityStatus

    def check(task, lib, base):
        warm = prestart_candidate(task) if prestarted else None
        out = run_candidate(task, lib, base, shapes=[SHAPE], warm=warm)
        if warm is not None:   # the pre-started child ran the job, and is gone
            assert warm.proc.used and not warm.proc.alive
        return out

    task, lib = make_task(tmp_path, "correct", rounds=4)
    base = compile_lib(source("correct"), tmp_path / "base.so")
    launch, par, bench, _ = check(task, lib, base)
    assert launch is None   # no launch context: a CPU task
    assert par.status == ParityStatus.ok and len(par.checks) == 20, par.message     # 12, 4 of values, 4 views (issue 62)
    assert bench is not None and bench[0].status == BenchStatus.ok, bench
    assert bench[0].speedup_vs_baseline.rounds == 4 and bench[0].timing("reference") is None
    # a crash during the bench: parity is reported passed, the bench crashed
    # 120: past parity's calls (counted, not timed), within what the bench makes even on a loaded 2-core machine (400
    # was not, once, on CI: the bench ended first and was reported passed)
    late = compile_lib(_crash_after(120), tmp_path / "late.so")
    _, par, bench, _ = check(task, late, base)
    assert par.status == ParityStatus.ok, par.message
    assert bench[0].status == BenchStatus.crashed and "SIGSEGV" in bench[0].message
    assert "@@agent-stage" not in bench[0].message
    # a crash during parity: parity crashed, no bench
    early = compile_lib(_crash_after(1), tmp_path / "early.so")
    _, par, bench, _ = check(task, early, base)
    assert par.status == ParityStatus.crashed and "SIGSEGV" in par.message and bench is None
    # a wrong kernel: parity's own verdict, no bench
    task_w, wrong = make_task(tmp_path, "offbyone")
    _, par, bench, _ = check(task_w, wrong, base)
    assert par.status == ParityStatus.mismatch and bench is None


def test_a_prestarted_child_is_used_only_for_the_files_it_loaded_and_never_outlives_its_use(tmp_path):
    import os
    import time

    from tools.judge.candidate import prestart_candidate, run_candidate
    from tools.results import ParityStatus
    task, lib = make_task(tmp_path, "correct", rounds=4)
    base = compile_lib(source("correct"), tmp_path / "base.so")
    # the task's module changed after the child loaded it: a fresh child runs the job, the stale one is ended
    warm = prestart_candidate(task)
    module = task.root / task.spec.module
    os.utime(module, ns=(time.time_ns(), module.stat().st_mtime_ns + 10**9))
    assert not warm.serves(task)
    _, par, bench, _ = run_candidate(task, lib, base, shapes=[SHAPE], warm=warm)
    assert par.status == ParityStatus.ok and bench[0].status == BenchStatus.ok
    assert not warm.proc.alive and warm.proc.used
    # a child never given a job ends when it is closed (the loop closes it when the build fails)
    unused = prestart_candidate(task)
    assert unused.proc.alive
    unused.close()
    assert not unused.proc.alive
    # and it ends by itself on end-of-file: what it sees when the agent dies
    eof = prestart_candidate(task)
    eof.proc._proc.stdin.close()
    assert eof.proc._proc.wait(timeout=60) == 0
    # a job past the limit: the group is killed and the outcome says so
    hang_task, hang = make_task(tmp_path / "h", "hang")
    slow = prestart_candidate(hang_task)
    t0 = time.monotonic()
    res = slow.proc.run(__import__("json").dumps({"lib": str(hang), "seed": 1, "shapes": [SHAPE],
                                                  "launch_context": None, "baseline_lib": None}), 3.0)
    assert res.status.value == "timeout" and time.monotonic() - t0 < 30 and not slow.proc.alive


def test_the_cpu_matmul_is_timed_against_what_a_user_calls():
    """"vs reference" times float32 torch.matmul, not the float64 truth parity compares with (2.5x slower
    on the 256-cube, which flattered every CPU candidate by that factor)."""
    import torch
    task = load_task(REPO / "kernels" / "matmul_cpu")
    mod = task.module()
    a, b = mod.make_inputs(task.spec.main, 1, "cpu", "normal")
    got = mod.timing_reference(task.spec.main, a, b)
    assert got.dtype == torch.float32 and torch.equal(got, torch.matmul(a, b))
    assert mod.reference(task.spec.main, a, b).dtype == torch.float32    # the truth: computed in float64


def test_the_judges_clock_holds_the_hosts_timings_to_what_it_saw():
    """tools.measure.stats.outside_check on bursts as the judge records them: (arm, ms the host reported,
    ms the judge measured around the request). Each forgery class, and the honest cases beside it."""
    from tools.measure.stats import outside_check

    def rounds(cand, base, k=10, jitter=0.0):
        out = []
        for i in range(k):
            j = jitter * ((i % 3) - 1)
            out += [("candidate", *cand), ("baseline", base[0], base[1] + j)]
        return out
    # honest: a 2x kernel, a slower one, an A/A, each with 1 ms of unreported overhead (+- jitter)
    assert outside_check(rounds((50, 51), (100, 101), jitter=1.5)) is None
    assert outside_check(rounds((150, 151), (100, 101))) is None
    assert outside_check(rounds((100, 101.5), (100, 101))) is None
    # the host claims more time than passed
    why = outside_check(rounds((120, 51), (100, 101)))
    assert why is not None and "judge's clock" in why and "forged" in why
    # the candidate's times shaved: it claims 12 ms, the judge saw 51 ms pass (a real 2x claimed as 8x)
    why = outside_check(rounds((12, 51), (100, 101)))
    assert why is not None and "under-reported the candidate's bursts by 38 ms" in why
    # shaved but still slower than the baseline: forged all the same where the bench claims the gain its host
    # reported (90 ms against 100), passed where it claims none (the bench's own interval is what it claims)
    assert outside_check(rounds((90, 300), (100, 101))) is not None
    assert outside_check(rounds((90, 300), (100, 101)), claimed={"baseline"}) is not None
    assert outside_check(rounds((90, 300), (100, 101)), claimed=set()) is None
    # a real gain inflated by a little more than a tenth of it is caught, by less is not
    assert outside_check(rounds((44, 51), (100, 101))) is not None      # 56 claimed, 7 unseen
    assert outside_check(rounds((47, 51), (100, 101))) is None          # 53 claimed, 4 unseen < 5.3
    # bursts of a few reps (0.35 ms: a stall inflated an arm's estimate on a loaded machine), the floor 7 us:
    # a host that shaves 20 us (6%) off each such burst is caught under pipe jitter, and so is one that
    # leaves two rounds of nine honest (a rule on the lower end of the rounds, not their median, let it pass)
    jitter = [0.012, -0.005, 0.009, -0.003, 0.008, 0.011, -0.004, 0.010, 0.006]
    shaved = [b for d in jitter for b in (("candidate", 0.28, 0.35 + d / 4), ("baseline", 0.30, 0.35))]
    assert "under-reported the candidate's bursts" in (outside_check(shaved) or "")
    partly = [b for i in range(9) for b in (("candidate", 0.30 if i in (2, 6) else 0.28, 0.35), ("baseline", 0.30, 0.35))]
    assert "under-reported the candidate's bursts" in (outside_check(partly) or "")
    # a host that shaves every round on a loaded machine whose spikes spread the rounds' unreported differences over
    # 2-30 ms (a spread that hides their median from its standard error: the fast tier let the clock-dividing kernel
    # through a second bench so) is caught by the rounds' lower end; honest spikes either way are not
    spiked = [b for d in (14, 2, 26, 30, 3, 14, 25, 5, 28) for b in (("candidate", 1.0, 1.5 + d), ("baseline", 14.0, 14.5))]
    assert "under-reported the candidate's bursts by 14 ms" in (outside_check(spiked) or "")
    both = [b for d in (0.1, -0.2, 5, -4, 0.3, 8, -6, 0.0, 0.2) for b in (("candidate", 10.0, 10.5 + max(d, 0)),
                                                                       ("baseline", 14.0, 14.5 - min(d, 0)))]
    assert outside_check(both) is None
    # warm-up bursts (one per arm, before the rounds) are not paired
    assert outside_check([("candidate", 1, 80), ("baseline", 1, 2)] + rounds((50, 51), (100, 101))) is None


def test_an_honest_host_on_a_loaded_machine_is_not_called_a_forger_and_a_shaving_one_still_is():
    """Bursts recorded from the judge (tools/judge/hostruns.py) on this 2-core machine while two no-op loop runs, a
    compiler loop and the recorder shared it: four benches whose median unreported difference passed the floor
    (preemptions of 3-6 ms in some rounds, not others; .ci/run refused a no-op candidate on such rounds). Each
    is honest; the same rounds with the candidate's reported times cut by a fifth or a half are forged."""
    from tools.measure.stats import outside_check
    benches = json.loads((Path(__file__).parent / "fixtures" / "bursts" / "loaded_2core.json").read_text())
    assert len(benches) == 4
    for bursts in benches:
        assert outside_check([tuple(b) for b in bursts]) is None, bursts
        for cut in (0.2, 0.5):
            shaved = [(a, i * (1 - cut) if a == "candidate" else i, o) for a, i, o in bursts]
            assert "under-reported the candidate's bursts" in (outside_check(shaved) or ""), (cut, bursts)


def test_a_host_that_under_reports_without_claiming_a_gain_is_not_called_a_forger(tmp_path):
    """The outside check vouches for a claimed saving: a bench whose interval against the baseline reaches 1 claims
    none, and is not refused for time its host left unreported (.ci/run refused a no-op candidate so on the loaded
    2-core machine: honest rounds whose preemptions fell on its side, 2.3-2.5 ms in two benches of 7 rounds).
    tests/fixtures/cheats' forge_clock kernel (compensated sums, 2-3x slower than the initial kernel) here divides
    its bursts' times by 1.25 only: still slower than its baseline, so its bench claims no gain, gives its (slower)
    figure and is not kept by it; the same kernel dividing by 17 claims a gain and is refused (the test below).
    Fails if the bench held every arm to the judge's clock whatever it claims."""
    from tests.fixtures.cheats.cheats import source as cheat
    src = cheat("forge_clock")
    assert "ts = [t / 17.0 for t in ts]" in src
    task, honest = make_task(tmp_path, "correct")
    lib = compile_lib(src.replace("ts = [t / 17.0 for t in ts]", "ts = [t / 1.25 for t in ts]"), tmp_path / "lib.so")
    [r] = run_bench(task, lib, baseline_lib=honest, shapes=[SHAPE], with_reference=False)
    assert r.status == BenchStatus.ok, r.message
    assert "clocks disagreed" not in r.message and r.speedup_vs_baseline.high < 1.0, r.message


FORGED_BURSTS = 11      # a bench's candidate bursts in the host: 2 rep costs and a warm-up, then 8 rounds


@pytest.mark.parametrize("forged, ok", [(FORGED_BURSTS, True), (10 ** 6, False)], ids=["first-bench", "every-bench"])
def test_clocks_that_disagree_in_one_bench_are_timed_again_and_a_host_that_forges_each_is_refused(tmp_path, forged, ok):
    """The outside check (the judge's clock around each burst against the host's word) refuses a bench
    whose host under-reports; on a loaded machine an honest host's clocks can disagree once (.ci/run
    refused an honest initial kernel so, beside two other test runs on 2 cores). The bench is then run
    once more and only a bench whose clocks agree gives figures. The kernel of tests/fixtures/cheats
    that divides the host's clock by 17 does it here for its first `forged` bursts only: forged through
    the first bench, it gets the second bench's true figures; forged throughout, it is refused after
    both. The first direction fails without the second bench; the second, if the second bench's figures
    were taken whatever its clocks said."""
    from tests.fixtures.cheats.cheats import source as cheat
    src = cheat("forge_clock")
    hook = "        if calls.value - seen >= n:        # every rep was a call of this library\n"
    assert hook in src
    src = src.replace("    real = clocks.CpuClock.run\n", f"    real = clocks.CpuClock.run\n    left = [{forged}]\n", 1)
    src = src.replace(hook, "        if calls.value - seen >= n and left[0] > 0:\n            left[0] -= 1\n", 1)
    task, honest = make_task(tmp_path, "correct")
    lib = compile_lib(src, tmp_path / "libonce.so")
    [r] = run_bench(task, lib, baseline_lib=honest, shapes=[SHAPE], with_reference=False)
    if ok:
        assert r.status == BenchStatus.ok, r.message
        assert "timed twice, the first bench's clocks disagreed (the host under-reported the candidate's" in r.message
        # the figures are the second bench's: the compensated kernel is slower than the plain one, not 17x faster
        assert r.speedup_vs_baseline.median < 1.2, r.speedup_vs_baseline
    else:
        assert r.status == BenchStatus.suspicious, r.message
        assert "under-reported the candidate's bursts" in r.message and "the same in a second bench" in r.message


BURSTY_REFERENCE = '''

import time as _time

_burst = {"last": 0.0, "slow": False}


def timing_reference(shape, a, b):
    """torch's matmul as a stalling thread pool makes it look: every other burst 3 ms slower a call
    (a burst starts after a gap: the other arms ran in between)."""
    if _time.perf_counter() - _burst["last"] > 5e-4:
        _burst["slow"] = not _burst["slow"]
    out = reference(shape, a, b)
    if _burst["slow"]:
        _time.sleep(0.003)
    _burst["last"] = _time.perf_counter()
    return out
'''


def test_a_figure_against_a_reference_whose_rounds_disagree_is_unstable_not_a_number(tmp_path):
    """The newcomer's run printed 0.087x [0.085, 8.565] vs the reference (torch's threads stalling now
    and then on a loaded machine), and another place 7.98x for the same kernel. A reference whose every
    other burst stalls makes the rounds' ratios 100x apart: the code before printed their median, a
    figure off by more than 2x whichever mode was true; now the bench is timed once more and, the
    reference unstable again, says so with both intervals and gives no figure. Its own timings and the
    figure against the baseline still stand."""
    task, lib = make_task(tmp_path, "correct")
    py = task.root / "task.py"
    py.write_text(py.read_text() + BURSTY_REFERENCE)
    task = load_task(task.root)
    [r] = run_bench(task, lib, shapes=[SHAPE], with_reference=True)
    assert r.status == BenchStatus.ok, r.message
    assert r.speedup_vs_reference is None and r.speedup_vs_reference_ci is None, r.message
    assert "vs reference unstable: its rounds' ratios spanned" in r.message and "in two benches" in r.message
    assert "x vs reference" not in r.message.replace("vs reference unstable", "")
    assert r.timing("reference") is not None and r.timing("candidate").median_ms > 0



THREADS_WAIT_REFERENCE = '''

import time as _time

import torch as _torch


def timing_reference(shape, a, b):
    """torch's matmul as threads that wait on a busy machine make it look: slower by 3 ms on every
    call while torch is set to more than one thread, itself on one. The product itself on one thread:
    real threads spinning here would slow the suite's other worker's timings on 2 cores."""
    n = _torch.get_num_threads()
    _torch.set_num_threads(1)
    try:
        out = reference(shape, a, b)
    finally:
        _torch.set_num_threads(n)
    if n > 1:
        _time.sleep(0.003)
    return out
'''

STEADY_REFERENCE = '''

import time as _time

import torch as _torch


def timing_reference(shape, a, b):
    """1 ms, then the product on one torch thread, however many torch has."""
    _time.sleep(0.001)
    n = _torch.get_num_threads()
    _torch.set_num_threads(1)
    try:
        return reference(shape, a, b)
    finally:
        _torch.set_num_threads(n)
'''


def _threads(task, n: int):
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace('device = "cpu"\n', f'device = "cpu"\ncpu_threads = {n}\n'))
    return load_task(task.root)


def test_a_reference_whose_threads_wait_on_every_round_is_unstable_not_a_number(tmp_path):
    """Stalls on every round are stable: a 96x160x72 matmul on 2 torch threads beside one busy
    process on 2 cores printed 38.7x [35.6, 39] against the reference, 370 times off, where the rule
    for rounds that disagree saw nothing to refuse. Now the reference is also timed on one thread, and
    threads more than 1.5x slower than one give no figure, with both times. The honest direction: a
    reference as fast on 2 threads as on one keeps its figure."""
    task, lib = make_task(tmp_path, "correct")
    task = _threads(task, 2)
    py = task.root / "task.py"
    plain = py.read_text()
    py.write_text(plain + THREADS_WAIT_REFERENCE)
    [r] = run_bench(load_task(task.root), lib, shapes=[SHAPE], with_reference=True)
    assert r.status == BenchStatus.ok and r.threads == 2, r.message
    assert r.speedup_vs_reference is None and r.speedup_vs_reference_ci is None, r.message
    # (on a machine the suite's other worker keeps busy, the rounds may also disagree: refused first by
    # that rule, as rightly)
    assert re.search(r"vs reference unstable: torch took [\d.]+ ms a call on 2 CPU threads and [\d.]+ ms on one: "
                     r"its threads wait", r.message) or "vs reference unstable: its rounds' ratios spanned" in r.message, \
        r.message
    assert r.speedup_vs_baseline is None and r.timing("candidate").median_ms > 0
    # the other direction, on a machine that may be busy (the suite's other worker): a reference whose
    # time does not depend on torch's threads keeps its figure on 2 threads
    py.write_text(plain + STEADY_REFERENCE)
    [r] = run_bench(load_task(task.root), lib, shapes=[SHAPE], with_reference=True)
    assert r.status == BenchStatus.ok and r.speedup_vs_reference is not None, r.message
    assert "(on 2 CPU threads)" in r.message and "unstable" not in r.message, r.message


@pytest.mark.slow
def test_beside_busy_processes_a_threaded_reference_gives_a_right_figure_or_none(tmp_path):
    """The real thing: a busy process on every core beside a bench whose reference runs on 2 torch
    threads. Before, 38.7x against the reference where an idle machine measured 0.05x; now the figure
    is within 2x of the idle one, or there is none and the message says why."""
    shape = {"M": 96, "N": 160, "K": 72}
    task, lib = make_task(tmp_path, "correct")
    task = _threads(task, 2)
    # "idle" is this machine beside whatever else the suite runs (.ci/run's other worker once slowed the
    # idle bench's candidate to 0.60 ms from 0.37 ms): as in the A/A test, a second attempt decides,
    # while a figure tens of times off fails both
    for _attempt in range(2):
        [idle] = run_bench(task, lib, shapes=[shape], with_reference=True)
        assert idle.status == BenchStatus.ok, idle.message
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
        try:
            [r] = run_bench(task, lib, shapes=[shape], with_reference=True)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        assert r.status == BenchStatus.ok, r.message
        if r.speedup_vs_reference is None:
            assert "vs reference unstable: " in r.message, r.message
            break
        if idle.speedup_vs_reference is None or 0.5 <= r.speedup_vs_reference / idle.speedup_vs_reference <= 2.0:
            break
    assert r.speedup_vs_reference is None or idle.speedup_vs_reference is None or \
        0.5 <= r.speedup_vs_reference / idle.speedup_vs_reference <= 2.0, (r.message, idle.message)

@pytest.mark.slow
def test_a_run_against_an_unstable_reference_prints_no_figure_against_it_anywhere(tmp_path):
    """Through `agent optimize` and `agent show`: the setup says the reference is unstable, and no
    figure against it is made elsewhere from the two medians (agent/records/figures.py's fallback for old runs)."""
    import json as _json

    from agent.records.store import read_state
    from tests.userrepo import agent, git, make_user_repo
    root = make_user_repo(tmp_path / "user")
    py = root / "kernels" / "matmul_cpu" / "task.py"
    py.write_text(py.read_text() + BURSTY_REFERENCE)
    git(root, "commit", "-qam", "a reference that stalls every other burst")
    res = agent(root, "optimize", "kernels/matmul_cpu", "--iters", "1", "--target", "100x", "--run-id", "unstable",
                timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    out = res.stdout + res.stderr
    assert "reference unstable: no figure against it" in out, out[-3000:]
    st = read_state(root / "runs" / "unstable")
    assert st.reference_ms is None and st.initial_vs_reference is None and st.confirmed_vs_reference is None
    show = agent(root, "show", "unstable", "--json", timeout=120)
    assert show.returncode == 0 and _json.loads(show.stdout)["best"]["vs_reference"] is None, show.stdout[-2000:]
    assert "x vs reference" not in out, out[-3000:]

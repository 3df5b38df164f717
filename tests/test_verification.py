"""Verification that cannot be fooled: every CPU cheat and fault of tests/fixtures/cheats/ is pushed
through ONE real loop run (replay proposer, real g++, real subprocesses, a real git repo), each must be
rejected with the right reason while the loop goes on, and a real improvement at the end must be kept.

The CUDA-only patterns are in scripts/device/verify_gpu.py (run on the GPU; wrapped by the gpu-marked
test at the bottom). VERIFICATION.md tabulates both.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from agent.records.schema import Decision
from agent.records.store import read_config, read_iterations, read_state
from tests.fixtures.cheats.cheats import CASES, GOOD, Case, proposal, source
from tests.userrepo import agent, git, make_user_repo, snapshot

BUILD_TIMEOUT_S = 6      # the compile-timeout fault needs minutes; an honest build takes 0.1-0.5 s (matmul.cpp)
# The infinite loop is killed at parity's budget (the run's, measured at setup: 4 x the initial kernel's 0.5 s +
# 6 s, capped at this). An honest parity of this task takes 0.2-0.5 s (the records of a whole suite run,
# 2026-11-29) and an honest bench under 10 s on 2 busy cores; the task's defaults (180 s + 300 s) would make the
# hang cost eight minutes to show the same, and every second of the cap is a second the hang spins a core.
PARITY_TIMEOUT_S = 8
BENCH_TIMEOUT_S = 30


def verification_repo(root: Path) -> Path:
    """The user repo of tests/userrepo.py, with the 256^3 main shape (its roofline floor is far above a
    no-op call) and short build/parity/bench timeouts (the compile-timeout and infinite-loop faults)."""
    make_user_repo(root, scan_allow=True)   # the runtime probes are what it verifies
    toml = root / "kernels" / "matmul_cpu" / "task.toml"
    text = toml.read_text().replace("main_shape = 1", "main_shape = 2")
    text = text.replace("hidden_shapes = 1", f"hidden_shapes = 1\ntimeout_s = {PARITY_TIMEOUT_S}")
    assert "[bench]" in text and "\ntimeout_s" not in text.split("[bench]")[1], "the bench budget is set here"
    text = text.replace("[bench]\n", f"[bench]\ntimeout_s = {BENCH_TIMEOUT_S}\n")
    text += f"\n[build]\ntimeout_s = {BUILD_TIMEOUT_S}\n"
    toml.write_text(text)
    git(root, "commit", "-qam", "user: test settings")
    return root


def _stage_status(rec, outcome: str) -> str | None:
    stage = {"parity_failed": rec.parity, "compile_failed": rec.build, "bench_failed": rec.bench,
             "launch_rejected": rec.launch}.get(outcome)
    return stage.status.value if stage is not None else None


@pytest.mark.slow
def test_every_cpu_cheat_and_fault_is_rejected_and_the_loop_goes_on(tmp_path):
    # About 60 s on 2 cores, already one run for every case (a candidate an iteration, the per-case checks on its
    # records): what is left is each case's own build and the checks that catch it, the hang's stage budget among them
    root = verification_repo(tmp_path / "user")
    before = snapshot(root)
    cases = CASES + [GOOD]
    props = tmp_path / "cheats.json"
    props.write_text(json.dumps([proposal(c).model_dump() for c in cases]))
    t0 = time.monotonic()
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props),
                "--iters", str(len(cases)), "--target", "100x", "--quiet", "--run-id", "verify", timeout=900)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    run = root / "runs" / "verify"
    recs, state, cfg = read_iterations(run), read_state(run), read_config(run)
    assert [r.iteration for r in recs] == list(range(1, len(cases) + 1)), "every candidate got an iteration"
    assert state.status == "done"

    table = []
    for case, rec in zip(cases, recs):
        st = _stage_status(rec, case.expect)
        table.append(f"{case.name:18s} {rec.outcome.value:15s} {st or '-':14s} {rec.decision.value:9s} "
                     f"{rec.reason[:110]}")
    summary = "\n".join(table)
    print(f"\n{summary}\n({elapsed:.0f}s)")

    for case, rec in zip(cases, recs):
        where = f"{case.name}: {rec.outcome.value} / {rec.reason}"
        if case.kind != "good" and case.expect != "patch_did_not_apply":   # a refused patch records no proposal
            assert rec.proposal is not None and rec.proposal.hypothesis.startswith(f"[{case.name}]"), where
        if (case.status == ("imprecise",) and rec.outcome.value == "implausible" and "parity imprecise" in rec.reason
                and rec.decision == Decision.reverted):
            # a precision cheat near its budget (bfp_b: 6.0x against 5x on one hidden shape, under it on others) can
            # pass the loop's quick parity on the hidden shapes it drew, and is then refused by the same check at the
            # re-verification of its implausible speedup (.ci/run at a0cb07c): the error budget caught it all the same
            assert case.reason in rec.reason, where
            continue
        if (case.name == "spin_pool" and rec.outcome.value in ("inconclusive", "not_faster")
                and rec.decision == Decision.reverted):
            # its pool spins on after each call: on a loaded 2-core machine the bench beside it can stay undecided
            # through both longer benches (.ci/run at 524fb77: 1.55x [0.69, 2.10], then 1.11x [0.72, 1.33]) or come
            # out slower (.ci/run at 56f0089: 0.925x [0.713, 1.144]), and the candidate ends there, never reaching the
            # keep's check of the threads it left (tests/test_threads_left.py holds that check to this cheat): not
            # kept all the same
            continue
        assert rec.outcome.value == case.expect, where
        if case.kind == "good":
            continue
        assert case.reason in rec.reason, where
        if case.expect == "patch_did_not_apply":   # refused before any commit
            assert rec.decision == Decision.skipped and rec.commit_sha is None, where
            continue
        # never kept, and the rejected commit stays reviewable
        assert rec.decision == Decision.reverted, where
        assert rec.rejected_ref == f"refs/agent/{cfg.run_id}/rejected/{rec.iteration}"
        assert git(root, "rev-parse", rec.rejected_ref) == rec.commit_sha
        # rejected by the right check, named in the stage's typed result and in the reason
        st = _stage_status(rec, case.expect)
        assert st in case.status, f"{where} (stage status {st}, expected one of {case.status})"
        if case.hidden:
            assert rec.parity.worst().hidden, f"{case.name} must fail on a hidden shape, not a listed one"
            assert all(c.ok for c in rec.parity.checks if not c.hidden), "listed shapes pass: a real special case"
        if case.expect == "parity_failed":
            assert (run / f"iter-{rec.iteration}" / "parity.json").exists()
        if case.expect == "bench_failed":
            # a real cheat: it passed parity, and its timed median beat the honest best
            assert rec.parity is not None and rec.parity.status.value == "ok", where
            cand = rec.bench.timing("candidate")
            # (the cheats run 6-13x faster than the initial kernel idle; static_* 3.7x under .ci/run's load)
            assert cand is not None and cand.median_ms < state.initial_ms / 2, "the cheat would have won the bench"

    by = {c.name: r for c, r in zip(cases, recs)}
    # the roofline check names its floor; the floor is far above what the cheat's timed call took
    # (or the timed rounds' spot check got there first: its skipped calls leave the poison)
    # (issue 39: the memos keyed on a sample of their inputs are caught by parity's changed repeat now; the
    # roofline floor stays behind them, tests/test_verification.py's bench-only test)
    assert "changed in place" in by["fingerprint_cache"].parity.message
    # the timed rounds' spot check or the burst check caught the timing-loop detector before the roofline
    # had to (which one depends on whether the first call of a burst came 40 us after the last one)
    ts = by["timing_shortcut"].bench.message
    assert "timed round" in ts or "back to back" in ts, ts
    # the compile timeout was enforced at the task's limit, not waited out
    ct = by["compile_timeout"]
    assert ct.build.status.value == "timeout" and ct.times.build < BUILD_TIMEOUT_S + 15
    # the iteration after each crash / timeout ran its own build and parity in a fresh child
    for name in ("infinite_loop", "illegal_access", "host_segfault", "out_of_memory"):
        i = by[name].iteration
        nxt = recs[i]   # the record after it (iterations are 1-based)
        assert nxt.build is not None and nxt.build.status.value == "ok", f"after {name}: {nxt.reason}"
        assert nxt.parity is not None, f"after {name}: parity did not run"
    assert ct.times.build < BUILD_TIMEOUT_S + 15

    # zero cheats kept; the real improvement afterwards was kept and is the branch's best
    kept = [r for r in recs if r.decision == Decision.kept]
    assert [r.iteration for r in kept] == [len(cases)], summary
    good = kept[0]
    assert good.parity.status.value == "ok" and good.bench.speedup_vs_baseline.low > 1.0
    assert state.best_sha == good.commit_sha == git(root, "rev-parse", cfg.branch)
    assert git(root, "log", "--format=%H", f"{cfg.base_sha}..{cfg.branch}").split() == [good.commit_sha]
    assert git(Path(cfg.worktree), "status", "--porcelain") == ""
    # the user's checkout, branch, index and uncommitted work are untouched
    assert snapshot(root) == before
    (tmp_path / "verification_cpu.txt").write_text(summary + "\n")


# --- the new defences, at the instrument level (fast) ---------------------------------------------
def test_roofline_floor_is_far_below_honest_kernels_and_names_its_basis():
    from tools.measure.roofline import floor_ms, peaks
    # an honest single-core kernel at 256^3 runs in milliseconds; the floor on 2 cores is ~84 us
    fl = floor_ms(2 * 256 ** 3, 4 * 3 * 256 ** 2, "cpu", "float32", cores=2)
    assert 0.05 < fl.ms < 0.2 and "compute bound" in fl.basis and "2 core(s)" in fl.basis
    # H100/H200 by name; an fp16 task is bounded by the tensor peak, HBM by the part's bandwidth
    assert peaks("cuda: NVIDIA H200", "float16")[:2] == (990e12, 4.8e12)
    assert peaks("cuda: NVIDIA H100 80GB HBM3", "float16")[:2] == (990e12, 3.35e12)
    # softmax main shape (8192 x 4096 fp16, 128 MiB moved) on an H200: >= 14 us honest, floor ~14 us
    sm = floor_ms(None, 2 * 2 * 8192 * 4096, "cuda: NVIDIA H200", "float16")
    assert 10e-3 < sm.ms < 20e-3 and "memory bound" in sm.basis and "margin 2x" in sm.basis
    # no formulas, no floor; an unknown GPU gets peaks above any GPU (never flags honest work)
    assert floor_ms(None, None, "cpu", "float32") is None
    assert peaks("cuda: Some Future GPU", "float16")[0] > 2000e12


@pytest.mark.slow
def test_bench_flags_timing_loop_cheats_that_pass_parity(tmp_path):
    """The timing cheats, straight through parity and bench (no loop): the bench catches each, also those
    parity now catches first (issue 39: the memos keyed on 16 sampled values at the changed repeat).
    Not here: window_partial (parity's output-state call catches it), which the bench now times honest: its
    window closes at the first round's new values. And the exact memo (right on every call), which the bench
    now times at its honest kernel's speed (no timed call repeats another: tools/measure/rounds.py)."""
    import subprocess
    from tools.measure.bench import run_bench
    from tools.measure.parity import run_parity
    from tools.task import load_task
    root = verification_repo(tmp_path / "user")
    task = load_task(root / "kernels" / "matmul_cpu")
    for name, needle in (("timing_shortcut", "(timed round|back to back)"), ("fingerprint_cache", "(timed round|roofline floor)"),
                         ("fingerprint_partial", "(repeated earlier calls|timed round)")):
        cpp = tmp_path / f"{name}.cpp"
        cpp.write_text(source(name))
        lib = tmp_path / f"lib{name}.so"
        subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-o", str(lib), str(cpp)],
                       check=True, capture_output=True)
        want = {"fingerprint_cache": "stale_input", "fingerprint_partial": "stale_input"}.get(name, "ok")
        assert run_parity(task, lib).status.value == want, f"{name}: parity {want} expected"
        b = run_bench(task, lib, with_reference=False)[0]
        assert b.status.value == "suspicious" and re.search(needle, b.message), b.message
        assert re.search(r"\d", b.message)


# --- CUDA-only patterns: the device script, when a GPU is here --------------------------------------
@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_cheats_and_faults_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "scripts" / "device" / "verify_gpu.py"
    spec = importlib.util.spec_from_file_location("verify_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows, ok = mod.run_all(tmp_path, out_dir=tmp_path)
    assert ok, "\n".join(f"{r['pattern']}: {r['outcome']} {r['status']} kept={r['kept']} {r['reason']}" for r in rows)


@pytest.mark.nvcc
@pytest.mark.slow
def test_cuda_launch_faults_are_rejected_statically_without_a_gpu(tmp_path):
    """The compile-only half of the CUDA launch faults (the device script runs them through the loop):
    the patched softmax builds with nvcc, and the static launch check (the library's own plan + ptxas,
    against the sm_90 table limits) rejects the 2048-thread block and the 300 KiB of shared memory."""
    import importlib.util
    import shutil
    from tools.build.build import build, find_nvcc
    from tools.backends.device import table_limits
    from tools.judge.candidate import run_candidate
    from tools.measure.launch import static_check
    from tools.task import load_task
    if find_nvcc() is None:
        pytest.skip("nvcc not installed")
    path = Path(__file__).resolve().parent.parent / "scripts" / "device" / "verify_gpu.py"
    spec = importlib.util.spec_from_file_location("verify_gpu", path)
    vg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vg)
    from agent.evaluation.evaluate import Evaluator
    from tools.judge import batch as batch_eval
    from tools.judge.candidate import prestart_candidate
    cases = {c[0]: c for c in vg.CASES}
    limits = table_limits("sm_90")
    rejected = []
    for name, rule in (("threads_2048", "block_too_large"), ("smem_over_optin", "smem_over_optin")):
        root = tmp_path / name
        shutil.copytree(Path(__file__).resolve().parent.parent / "kernels" / "softmax", root,
                        ignore=shutil.ignore_patterns("__pycache__"))
        src = (root / "softmax.cu").read_text()
        for search, replace in cases[name][3]:
            assert src.count(search) == 1
            src = src.replace(search, replace)
        (root / "softmax.cu").write_text(src)
        task = load_task(root)
        b = build(task, tmp_path / f"build-{name}")
        assert b.status.value == "ok", b.message
        res = static_check(task, b, limits)
        assert res.status.value == "rejected" and rule in {v.rule for v in res.violations}, res.message
        # the loop's one-child check reaches the same verdict from the plan it loads itself, and runs
        # nothing; so does a child pre-started before the build
        ctx = Evaluator(task, tmp_path, limits).launch_context(b, None)
        for warm in (None, prestart_candidate(task)):
            launch, par, bench, _ = run_candidate(task, Path(b.lib_path), None, launch_context=ctx, warm=warm)
            assert launch.status.value == "rejected" and rule in {v.rule for v in launch.violations}, launch.message
            assert launch.violations == res.violations and par is None and bench is None
        lib = tmp_path / f"lib-{name}.so"
        shutil.copy2(b.lib_path, lib)
        rejected.append((lib, ctx, res))
    # the unpatched kernel passes the launch check in the child and goes on to parity (which, without a
    # GPU, says so)
    task = load_task(Path(__file__).resolve().parent.parent / "kernels" / "softmax")
    b = build(task, tmp_path / "build-ok")
    ctx = {"limits": limits.model_dump(mode="json"), "kernels": [k.model_dump(mode="json") for k in b.kernels],
           "parent": None}
    launch, par, _, _ = run_candidate(task, Path(b.lib_path), None, launch_context=ctx)
    assert launch.status.value == "ok" and launch.main_ctas and launch.launches, launch.message
    assert par is not None
    if not _gpu():
        assert par.status.value == "error" and "no GPU" in par.message
    # `agent sweep`'s batch child: the same verdicts, library by library, in one process; only the
    # legal one goes on to parity
    libs = [lib for lib, _, _ in rejected] + [Path(b.lib_path)]
    results = dict(r for settled in batch_eval.evaluate(task, libs, Path(b.lib_path), batch=8,
                                                        contexts=[c for _, c, _ in rejected] + [ctx])
                   for r in settled)
    for k, (_, _, res) in enumerate(rejected):
        r = results[k]
        assert r.status.value == "launch_rejected" and r.parity is None and r.bench is None, r
        assert r.launch.violations == res.violations
    last = results[len(rejected)]
    assert last.launch is not None and last.launch.status.value == "ok" and last.parity is not None
    assert last.status.value == ("ok" if _gpu() else "parity_failed"), last.message


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.slow
def test_an_exact_memo_is_timed_at_its_honest_kernels_speed(tmp_path):
    """memo_exact_window.cpp (issue 39): an exact memo (right on every call) that, from the bench's warm-up
    on, recomputes a quarter of C on every repeat until it sees buffers it has never seen. Timed against
    the very kernel it wraps, without the memo: before the per-rep swaps 3.3-3.4x (it passed every check),
    now about 1x (the memo has nothing to serve: no timed call repeats another)."""
    import subprocess
    from tools.measure.bench import run_bench
    from tools.task import load_task
    root = verification_repo(tmp_path / "user")
    task = load_task(root / "kernels" / "matmul_cpu")
    libs = {}
    for name, text in (("fast", source("partial_output").replace("mm_fast(A, B, C, 1, N, K)", "mm_fast(A, B, C, M, N, K)")),
                       ("memo", source("memo_exact_window"))):
        (tmp_path / f"{name}.cpp").write_text(text)
        libs[name] = tmp_path / f"lib{name}.so"
        subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-o", str(libs[name]),
                        str(tmp_path / f"{name}.cpp")], check=True, capture_output=True)
    b = run_bench(task, libs["memo"], baseline_lib=libs["fast"], with_reference=False)[0]
    assert b.status.value == "ok", b.message
    assert b.speedup_vs_baseline.median < 1.5, b.message

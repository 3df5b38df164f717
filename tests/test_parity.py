"""Parity against real faulty CPU kernels (tests/fixtures/cpu_faults), compiled with g++ and run
through the real child process. A fast wrong kernel must never pass."""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tools.measure.compare import compare, poison_, poisoned_mask
from tools.measure.parity import run_parity
from tools.results import ParityStatus

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


# --- the comparison itself (in-process, no kernel) ---------------------------------------------
def test_poison_is_told_apart_from_a_computed_nan():
    out = torch.empty(4, 3)
    poison_(out)
    assert torch.isnan(out).all() and poisoned_mask(out).all()
    out[0, 0] = float("nan")           # what a kernel's 0/0 gives: a NaN without the payload
    out[1, 1] = 2.0
    exp = torch.ones(4, 3)
    c = compare(out, exp, 1e-4, 1e-4)
    assert c["status"] == "unwritten" and c["mismatches"] == 10 and c["worst_index"] == [0, 1]
    out[:] = 1.0
    out[2, 1] = float("nan")
    c = compare(out, exp, 1e-4, 1e-4)
    assert c["status"] == "nan_inf" and c["worst_index"] == [2, 1] and math.isnan(c["got"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_an_unwritten_element_is_unwritten_where_the_reference_is_nan_too(dtype):
    """A NaN in the reference does not excuse an element the kernel never wrote: the poison is found by its own bits
    (issue 62; before, `unwritten` was looked for only where the reference was finite, and any NaN matched a NaN). A
    NaN the kernel computed there still agrees."""
    exp = torch.tensor([1.0, float("nan"), 3.0, float("nan")], dtype=dtype)
    got = torch.empty(4, dtype=dtype)
    poison_(got)
    got[0], got[2] = 1.0, 3.0
    got[3] = float("nan")                     # computed: agrees with the reference's NaN
    c = compare(got, exp, 1e-3, 1e-3)
    assert c["status"] == "unwritten" and c["mismatches"] == 1 and c["worst_index"] == [1], c
    got[1] = torch.tensor(0.0, dtype=dtype) / 0.0
    assert compare(got, exp, 1e-3, 1e-3)["status"] == "ok"


def test_compare_reports_the_worst_element_and_honours_the_reference_specials():
    exp = torch.tensor([1.0, 100.0, float("inf"), float("nan"), 0.0])
    got = exp.clone()
    got[3] = float("nan")
    assert compare(got, exp, 1e-3, 1e-3)["status"] == "ok"
    got[1] = 100.05                     # within 1e-3 + 1e-3 * 100
    got[4] = 0.01                       # outside 1e-3
    c = compare(got, exp, 1e-3, 1e-3)
    assert c["status"] == "mismatch" and c["mismatches"] == 1 and c["worst_index"] == [4]
    assert c["expected"] == 0.0 and abs(c["got"] - 0.01) < 1e-6 and abs(c["max_abs_err"] - 0.05) < 1e-4
    got[4] = 0.0
    got[2] = 5.0                        # the reference is +Inf here: a finite value is wrong
    assert compare(got, exp, 1e-3, 1e-3)["status"] == "mismatch"
    ints = torch.empty(5, dtype=torch.int32)
    poison_(ints)
    ints[:3] = 7
    c = compare(ints, torch.full((5,), 7, dtype=torch.int32), 0, 0)
    assert c["status"] == "unwritten" and c["mismatches"] == 2


# --- real kernels through the child ------------------------------------------------------------
def test_correct_kernel_passes_every_shape_with_hidden_shapes_and_errors_reported(tmp_path):
    task, lib = make_task(tmp_path, "correct")
    res = run_parity(task, lib, seed=1234)
    assert res.status == ParityStatus.ok, res.message
    # 2 listed + 1 hidden shape, x 2 distributions x 2 seeds; then the values past the sample (issue 62) on the
    # smallest listed shape and the hidden one, one seed each: large, tiny (the task declares no specials); and the
    # views off the allocator's alignment on the same two shapes (tools/measure/views.py)
    assert len(res.checks) == 20 and all(c.ok for c in res.checks)
    values = [c for c in res.checks if c.label.startswith("values ")]
    assert len(values) == 4 and {c.dist for c in values} == {"values:large", "values:tiny"}
    views = [c for c in res.checks if c.label.startswith("misaligned ")]
    assert len(views) == 4 and {c.dist for c in views} == {"offset:same", "offset:apart"}
    assert {c.dist for c in res.checks if c not in values + views} == {"normal", "uniform"}
    assert len({c.seed for c in res.checks}) == 20   # each check's inputs their own draw (buffers.check_seed)
    hidden = [c for c in res.checks if c.hidden and c not in values + views]
    assert len(hidden) == 4 and all(c.label.startswith("hidden ") for c in hidden)
    assert all(c.max_abs_err is not None and c.max_abs_err < 1e-4 and c.numel > 0 for c in res.checks
               if c not in values)                                    # (values: at magnitudes near 1e30)
    # where each check's seconds went (issue 66): its draw and the candidate's calls (four: two poisoned, the
    # output-state call, the changed repeat; two on a values draw), within the check's own seconds
    for c in res.checks:
        assert c.parts is not None and set(c.parts) == {"draw", "calls"}, c.label
        assert c.parts["draw"] >= 0 and c.parts["calls"] > 0 and sum(c.parts.values()) <= c.seconds + 1e-3, c
    again = run_parity(task, lib, seed=1234, hidden=False)
    assert again.status == ParityStatus.ok and len(again.checks) == 8 and not any(c.hidden for c in again.checks)
    key = lambda r: {(c.label, c.dist, c.seed) for c in r.checks}  # noqa: E731
    assert key(again) < key(res)   # a given seed reproduces every check's inputs


def test_the_loops_quick_parity_and_the_rest_before_a_keep_split_the_full_parity_by_seed(tmp_path):
    """Issue 44: a loop candidate's first parity ("quick") checks the listed and hidden shapes, every distribution, on
    the first seed; a candidate about to be kept pays for the rest (the other seeds, the [dims] extremes: this task
    has none). Together they are the full parity, check for check, nothing twice; a one-seed task has no rest."""
    task, lib = make_task(tmp_path, "correct")
    full, quick, rest = (run_parity(task, lib, seed=1234, extent=e) for e in ("full", "quick", "rest"))
    assert all(r.status == ParityStatus.ok for r in (full, quick, rest)), (quick.message, rest.message)
    key = lambda r: [(c.label, c.dist, c.seed) for c in r.checks]  # noqa: E731
    assert len(quick.checks) == 6 and len({(c.label, c.dist) for c in quick.checks}) == 6
    assert any(c.hidden for c in quick.checks)
    assert sorted(key(quick) + key(rest)) == sorted(key(full)) and not set(key(quick)) & set(key(rest))
    assert "x 1 seed (the other 1 before a keep)" in quick.message and "x 1 seed each" in rest.message, rest.message
    assert not any(c.label.startswith("values ") for c in quick.checks)       # the value draws: before a keep
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace("seeds = 2", "seeds = 1"))
    from tools.task import load_task
    one = load_task(task.root)
    rest = run_parity(one, lib, seed=1234, extent="rest")      # the value draws and the views alone (issue 62)
    assert rest.status == ParityStatus.ok and rest.checks and all(c.label.split(" ")[0] in ("values", "misaligned")
                                                                  for c in rest.checks)
    assert len(run_parity(one, lib, seed=1234, extent="quick").checks) == 6


@pytest.mark.parametrize("kernel, status, words", [
    ("half", ParityStatus.unwritten, "never written"),          # also prints a forged ok JSON line
    ("nan", ParityStatus.nan_inf, "NaN/Inf"),
    ("mutate", ParityStatus.input_mutated, "changed its inputs"),
    ("oob", ParityStatus.out_of_bounds, "outside its output"),
    ("segv", ParityStatus.crashed, "SIGSEGV"),
    ("counter", ParityStatus.nondeterministic, "first call matched"),
    ("ptrcache", ParityStatus.output_state, "before the call"),   # "the result is already there"
    ("inptrcache", ParityStatus.stale_input, "changed in place"),   # before issue 39: mismatch on the next seed
    ("zerofill", ParityStatus.output_state, "before the call"),   # right into the poison, not into values
])
def test_faulty_kernel_is_caught(tmp_path, kernel, status, words):
    task, lib = make_task(tmp_path, kernel)
    res = run_parity(task, lib)
    assert res.status == status, res.message
    assert words in res.message and "\n" not in res.message
    if status in (ParityStatus.mismatch, ParityStatus.unwritten, ParityStatus.nan_inf):
        bad = res.worst()
        assert bad is not None and bad.worst_index is not None and bad.expected is not None
        assert bad.label in res.message and f"dist={bad.dist}" in res.message
        assert "expected" in res.message


def test_a_kernel_wrong_where_a_few_input_values_meet_a_condition_meets_one_draw_per_check(tmp_path):
    """A fast path chosen by a sample of the inputs' values (valuekey.cpp: wrong when A[0] > A[1], half the draws).
    Each check makes its inputs from a seed of its own (buffers.check_seed): with one seed for every shape, a task's
    make_inputs (one generator, seeded) started every shape's A with the same values, so parity drew A[0], A[1] once
    per seed and distribution, not once per check, and this kernel passed on seed 10 of these ten. Now 12 draws a
    run: it fails on each of them, and each check's seed makes other leading values."""
    task, lib = make_task(tmp_path, "valuekey")
    runs = [run_parity(task, lib, seed=s) for s in range(1, 11)]
    assert [r.status for r in runs] == [ParityStatus.mismatch] * 10, [r.message for r in runs]
    honest, good = make_task(tmp_path, "correct")
    inputs = {tuple(honest.module().make_inputs(c.shape, c.seed, "cpu", c.dist)[0].flatten()[:2].tolist())
              for c in run_parity(honest, good, seed=3, hidden=False).checks}
    assert len(inputs) == 8 or pytest.fail(f"{len(inputs)} distinct leading values in 8 checks")


def test_off_by_one_is_a_mismatch_naming_shape_index_expected_and_got(tmp_path):
    task, lib = make_task(tmp_path, "offbyone", hidden=0)
    res = run_parity(task, lib, seed=7)
    bad = res.worst()
    assert res.status == ParityStatus.mismatch and bad.label == "M=16,N=24,K=8" and bad.dist == "normal"
    assert f"{bad.worst_index}" in res.message and f"{bad.expected:.6g}" in res.message
    assert f"{bad.got:.6g}" in res.message and bad.max_abs_err > 1e-3 and bad.mismatches > 0
    # one failing check per shape: the first failure stops that shape, the next shape still runs (the value draws'
    # shape and the views' too: the smallest listed one, issue 62)
    assert [c.label for c in res.checks] == ["M=16,N=24,K=8", "M=33,N=17,K=29", "values M=16,N=24,K=8",
                                             "misaligned M=16,N=24,K=8"]


@pytest.mark.slow
def test_hanging_kernel_times_out_and_the_tool_survives(tmp_path):
    task, lib = make_task(tmp_path, "hang")
    res = run_parity(task, lib, timeout_s=5)
    assert res.status == ParityStatus.timeout and "timed out" in res.message and res.seconds < 15
    after = run_parity(task, compile_lib(source("correct"), tmp_path / "good.so"), hidden=False)
    assert after.status == ParityStatus.ok, after.message       # the next run works


def test_library_without_the_symbol_is_an_error_not_a_crash(tmp_path):
    task, _ = make_task(tmp_path, "correct")
    lib = compile_lib('extern "C" void not_matmul() {}\n', tmp_path / "nosym.so")
    res = run_parity(task, lib, hidden=False)
    assert res.status == ParityStatus.error and "matmul" in res.message and "\n" not in res.message


def test_the_parent_imports_neither_torch_nor_the_task_module():
    code = ("import sys, tools.measure.parity, tools.measure.bench; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('agent_task_')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nvcc") is None, reason="needs a CUDA GPU and nvcc")
def test_cuda_faults_are_caught(tmp_path):
    path = Path(__file__).resolve().parent.parent / "scripts" / "device" / "parity_bench_gpu.py"
    spec = importlib.util.spec_from_file_location("parity_bench_gpu", path)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    (tmp_path / "task.toml").write_text(g.TOML.replace("{ n = 67108864 }", "{ n = 1048576 }"))
    (tmp_path / "task.py").write_text(g.TASK_PY)
    (tmp_path / "saxpy.cu").write_text(g.KERNEL % g.GOOD)
    from tools.task import load_task
    task = load_task(tmp_path)
    for name in ("correct", "oob_tail", "nan", "threads2048"):
        overrides, expect = g.VARIANTS[name]
        res = run_parity(task, g.build(tmp_path, name, overrides))
        assert res.status.value in expect.split("|"), (name, res.message)


def test_the_output_state_call_fails_when_its_call_is_replaced_by_a_no_op(tmp_path):
    """Ghost replay of the output-state check (issue 39): with the kernel's third call replaced by a
    no-op, the check must fail, for each state it puts in the output (an earlier call's result, zeros,
    random values); with the real call it passes. A check that passed here would be reading something
    the kernel did not compute."""
    from tools.measure.parity import STATES, check
    task, lib = make_task(tmp_path, "correct", hidden=0)
    mod = task.module()
    handle = task.backend.load(str(lib))
    seen = set()
    for seed in range(4):   # checks rotate through the states: every one of them fails as a ghost
        res = check(task, mod, handle, seed=seed, hidden=False, run=mod.run, run_kept=lambda *a: None)
        assert res.status == ParityStatus.output_state, res.message
        assert "before the call" in res.message and "it must not depend on what the output holds" in res.message
        seen.add(res.message.split(" before the call")[0].removeprefix("into an output that held "))
    assert seen == {"random values"}, seen   # the first check of a shape: no earlier result, so random
    ghost_states = []
    for n in range(len(STATES) + 1):   # the n-th check's state, as a ghost: run the first n checks for real
        calls = iter(range(10 ** 6))   # two kept calls per check: the output-state call, the changed repeat

        def kept(lib, shape, out, *inputs, n=n):
            if next(calls) != 2 * n:
                mod.run(lib, shape, out, *inputs)
        res = check(task, mod, handle, seed=11, hidden=False, run=mod.run, run_kept=kept)
        if res.status == ParityStatus.ok:
            continue   # fewer checks than n on this task
        assert res.status == ParityStatus.output_state, res.message
        ghost_states.append(res.message.split(" before the call")[0].removeprefix("into an output that held "))
    assert {"zeros", "random values", "an earlier call's result on other inputs"} <= set(ghost_states), ghost_states
    assert check(task, mod, handle, seed=11, hidden=False).status == ParityStatus.ok


def test_the_changed_repeat_fails_when_its_call_is_replaced_by_a_no_op(tmp_path):
    """Ghost replay of the changed-repeat call (issue 39): a few input values changed in place, the call
    into the output of the call before replaced by a no-op, must fail (the output holds the answer for the
    inputs before the change), on every check where it is the ghost; with the real call it passes. The
    inputs changed are the task's own draws: the result differs beyond the tolerance by construction."""
    from tools.measure.parity import check
    task, lib = make_task(tmp_path, "correct", hidden=0)
    mod = task.module()
    handle = task.backend.load(str(lib))
    failed = 0
    for n in range(4):
        calls = iter(range(10 ** 6))

        def kept(lib, shape, out, *inputs, n=n):
            if next(calls) != 2 * n + 1:
                mod.run(lib, shape, out, *inputs)
        res = check(task, mod, handle, seed=5, hidden=False, run=mod.run, run_kept=kept)
        if res.status == ParityStatus.ok and len(res.checks) <= n:
            continue   # fewer checks than n on this task
        assert res.status == ParityStatus.stale_input, res.message
        assert "changed in place" in res.message and "answered for the inputs before the change" in res.message
        failed += 1
    assert failed >= 2, failed
    assert check(task, mod, handle, seed=5, hidden=False).status == ParityStatus.ok


def test_a_parity_check_reads_back_a_dozen_values_not_one_per_input_and_statistic(tmp_path):
    """Issue 66: on a GPU every value parity reads back (a bool, a float, torch.equal) waits for the device, and the
    kept attention iteration's confirmation checks took 0.3 s each beside the sanitizers' kernels. A check (three
    calls, the changed repeat, the error budget) read back 46 times on this task; the verdicts and statistics
    are now read together: one read per comparison, per guard check, per input check. Counted in this process
    on the CPU (the same code as on a GPU). Fails if a read per input or per statistic comes back."""
    from torch.overrides import TorchFunctionMode

    from tools.measure.parity import check
    reads = {"n": 0}

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
                        torch.Tensor.tolist, torch.equal, torch.Tensor.nonzero, torch.nonzero):
                reads["n"] += 1
            return func(*args, **(kwargs or {}))

    task, lib = make_task(tmp_path, "correct")
    mod = task.module()
    handle = task.backend.load(str(lib))
    with Reads():
        res = check(task, mod, handle, seed=3, extent="quick")
    assert res.status == ParityStatus.ok and res.checks, res.message
    assert reads["n"] / len(res.checks) <= 15, (reads["n"], len(res.checks))

"""tools.measure.launch: static checks from real nvcc output + the library's own plan (no GPU needed);
the dynamic check (torch profiler trace) only where CUDA is available."""

import shutil
from pathlib import Path

import pytest

from tools.build.build import build, find_nvcc
from tools.backends.device import device_limits, table_limits
from tools.measure.launch import dynamic_check, from_plan, static_check
from tools.measure.launch_rules import block_registers, check_rules
from tools.results import BuildStatus, KernelResources, Launch, LaunchResult, LaunchStatus
from tools.task import knob_pattern, load_task

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "fixtures" / "cuda_launch"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _variant(tmp_path: Path, name: str, **knobs: int):
    """A copy of the fixture with some #define knobs rewritten, built; returns (task, build)."""
    d = tmp_path / name
    shutil.copytree(FIX, d)
    src = (d / "scale.cu").read_text()
    for k, v in knobs.items():
        src, n = knob_pattern(k).subn(rf"\g<1>{v}", src)
        assert n == 1, k
    (d / "scale.cu").write_text(src)
    task = load_task(d)
    b = build(task, d / "build")
    assert b.status == BuildStatus.ok, b.message
    return task, b


def _without_plan(task) -> None:
    """The task's launch_plan taken out of task.py, as a torch extension's author leaves it."""
    mod = task.root / "task.py"
    text = mod.read_text()
    assert "\ndef launch_plan(" in text
    mod.write_text(text.split("\ndef launch_plan(")[0])


def _rules(res: LaunchResult) -> set[str]:
    return {v.rule for v in res.violations}


@pytest.fixture(scope="module")
def limits():
    return table_limits("sm_90")


@pytest.mark.nvcc
@needs_nvcc
def test_default_fixture_passes_with_ptxas_resources(tmp_path, limits):
    task, b = _variant(tmp_path, "ok")
    res = static_check(task, b, limits)
    assert res.status == LaunchStatus.ok, res.message
    [ln] = res.launches
    assert ln.grid == (1048576 // 256, 1, 1) and ln.block == (256, 1, 1)
    assert ln.registers == b.kernels[0].registers and ln.smem_static_bytes == 256
    assert res.main_ctas == 4096 and res.waves == pytest.approx(4096 / 132)


@pytest.mark.nvcc
@needs_nvcc
def test_block_of_2048_threads_is_rejected(tmp_path, limits):
    task, b = _variant(tmp_path, "big", THREADS=2048)
    res = static_check(task, b, limits)
    assert res.status == LaunchStatus.rejected
    assert "block_too_large" in _rules(res)
    msg = next(v.message for v in res.violations if v.rule == "block_too_large")
    assert "2048" in msg and "1024" in msg


@pytest.mark.nvcc
@needs_nvcc
def test_dynamic_smem_over_optin_is_rejected(tmp_path, limits):
    task, b = _variant(tmp_path, "smem", SMEM_DYN=300000)
    res = static_check(task, b, limits)
    assert _rules(res) == {"smem_over_optin"}
    msg = res.violations[0].message
    assert "300256" in msg and str(limits.max_smem_per_block_optin) in msg     # dynamic + ptxas static
    # the limit follows the device: an L4's 99 KB opt-in rejects it too
    assert static_check(task, b, table_limits("sm_89")).status == LaunchStatus.rejected


def test_the_main_kernel_is_the_builds_own_and_a_library_launch_is_not_held_to_the_sm_floor(tmp_path, limits):
    """A task without launch_plan is judged from the trace, which holds every launch: cuBLAS's and ATen's too. The main
    kernel (the one held to the SM floor and to its parent's CTA count) is the first launch of a kernel the build
    compiled itself, and none where it compiled none: an imported KernelBench problem's scaffold (ATen calls) was
    refused on an H200 because cuBLAS ran its 128 x 256 GEMM on 48 CTAs (`agent check`: grid_too_small, and the
    scaffold could not be a run's starting point). The task's own kernel on too few CTAs is still refused."""
    d = tmp_path / "t"
    shutil.copytree(FIX, d)
    toml = d / "task.toml"
    toml.write_text(toml.read_text().replace('kernel_regex = "scale_kernel"\n', ""))
    task = load_task(d)
    assert task.spec.kernel_regex is None
    gemm = Launch(kernel="void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(Params)", grid=(48, 1, 1),
                  block=(128, 1, 1), source="trace")
    relu = Launch(kernel="void at::native::vectorized_elementwise_kernel<4, relu>(int, relu)", grid=(64, 1, 1),
                  block=(128, 1, 1), source="trace")
    mine = Launch(kernel="void fused_bias_relu<128>(float const*, float*, int)", grid=(8, 1, 1), block=(128, 1, 1),
                  source="trace")
    # ATen's kernels as a trace names them: the softmax scaffold's `agent check` raised in `_base_name` on an H200 (an
    # anonymous namespace: 'at::native::(anonymous namespace)::...' split at its parenthesis), before this was fixed
    anon = Launch(kernel="void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                  "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
                  grid=(4096, 1, 1), block=(1024, 1, 1), source="trace")
    odd = Launch(kernel="void at::native::(anonymous namespace)::", grid=(1, 1, 1), block=(32, 1, 1), source="trace")
    none, main = check_rules(task, [gemm, anon, relu, odd], limits, own=[])
    assert none == [] and main is None
    assert check_rules(task, [odd, anon], limits, own=["cunn_SoftMaxForward(float*)"])[1] == 4096
    plan = from_plan(task, {"ok": True, "planned": False}, [], limits)
    assert plan.status == LaunchStatus.ok and plan.own_kernels == []
    kernels = [KernelResources(name="fused_bias_relu<128>(float const*, float*, int)", mangled="_Z15fused_bias_relu")]
    assert from_plan(task, {"ok": True, "planned": False}, kernels, limits).own_kernels == [kernels[0].name]
    bad, main = check_rules(task, [gemm, mine], limits, own=[kernels[0].name])
    assert main == 8 and [(v.rule, v.kernel) for v in bad] == [("grid_too_small", mine.kernel)], bad
    assert [v.kernel for v in check_rules(task, [gemm, relu], limits)[0]] == [gemm.kernel]   # own unknown: the first
    assert [v.kernel for v in check_rules(task, [gemm, relu], limits, own=["other(int)"])[0]] == [gemm.kernel]


@pytest.mark.nvcc
@needs_nvcc
def test_small_grid_and_collapse(tmp_path, limits):
    task, b = _variant(tmp_path, "tiny", MAX_CTAS=2)
    res = static_check(task, b, limits)
    assert _rules(res) == {"grid_too_small"}
    assert "2 CTAs" in res.message and "132" in res.message
    # the seeds' failure: 2 CTAs on an L4's 58 SMs
    assert "58" in static_check(task, b, table_limits("sm_89")).message
    parent = LaunchResult(status=LaunchStatus.ok, main_ctas=4096)
    task2, b2 = _variant(tmp_path, "fewer", MAX_CTAS=512)
    assert static_check(task2, b2, limits).status == LaunchStatus.ok
    res2 = static_check(task2, b2, limits, parent=parent)
    assert _rules(res2) == {"cta_collapse"} and "4096" in res2.message


@pytest.mark.nvcc
@needs_nvcc
def test_plan_that_raises_is_an_error_not_a_crash(tmp_path, limits):
    task, b = _variant(tmp_path, "raises")
    mod = task.root / "task.py"
    mod.write_text(mod.read_text().replace('raise RuntimeError(f"cuda_launch_plan returned {count}")', "pass")
                   .replace("    buf = (ctypes.c_int * 7)()", "    raise ValueError('plan exploded')\n    buf = 0"))
    res = static_check(task, b, limits)
    assert res.status == LaunchStatus.error and "plan exploded" in res.message


@pytest.mark.nvcc
@needs_nvcc
def test_a_task_without_a_plan_passes_the_static_check_and_leaves_the_geometry_to_the_trace(tmp_path, limits):
    task, b = _variant(tmp_path, "planless", MAX_CTAS=2)     # 2 CTAs: the plan would have said so
    _without_plan(task)
    parent = LaunchResult(status=LaunchStatus.ok, main_ctas=4096)
    res = static_check(task, b, limits, parent=parent)
    assert res.status == LaunchStatus.ok and res.launches == [] and "profiler trace" in res.message
    assert res.parent_main_ctas == 4096     # for the trace, which alone can apply the collapse rule


def test_rules_on_plans_alone(limits):
    task = load_task(FIX)
    odd = Launch(kernel="scale_kernel", grid=(1000, 1, 1), block=(100, 1, 1))
    v, ctas = check_rules(task, [odd], limits)
    assert {x.rule for x in v} == {"block_multiple_of_32"} and ctas == 1000
    heavy = Launch(kernel="scale_kernel", grid=(1000, 1, 1), block=(1024, 1, 1), registers=255)
    v, _ = check_rules(task, [heavy], limits)
    assert [x.rule for x in v] == ["registers_over_sm"] and "255 registers x 1024 threads" in v[0].message
    assert block_registers(255, 1024) == 262144 and block_registers(33, 128) == 40 * 32 * 4
    zero = Launch(kernel="scale_kernel", grid=(0, 1, 1), block=(128, 1, 1))
    v, _ = check_rules(task, [zero], limits)
    assert "grid_invalid" in {x.rule for x in v}
    # the main kernel is the first matching kernel_regex, not the first launch
    helper = Launch(kernel="zero_fill", grid=(1, 1, 1), block=(32, 1, 1))
    v, ctas = check_rules(task, [helper, odd.model_copy(update={"block": (128, 1, 1)})], limits)
    assert v == [] and ctas == 1000


def test_cpu_task_is_not_applicable(tmp_path):
    task = load_task(ROOT / "kernels" / "matmul_cpu")
    b = build(task, tmp_path / "b")
    assert static_check(task, b, device_limits()).status == LaunchStatus.not_applicable
    assert dynamic_check(task, b.lib_path, device_limits(), LaunchResult(status=LaunchStatus.ok)).status \
        == LaunchStatus.not_applicable


def test_failed_build_is_an_error(tmp_path, limits):
    from tools.results import BuildResult
    task = load_task(FIX)
    res = static_check(task, BuildResult(status=BuildStatus.compile_error, build_dir=str(tmp_path)), limits)
    assert res.status == LaunchStatus.error and "compile_error" in res.message


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_dynamic_check_reads_the_real_geometry_and_catches_a_lying_plan(tmp_path):
    task, b = _variant(tmp_path, "dyn")
    limits = device_limits(b.arch)
    plan = static_check(task, b, limits)
    assert plan.status == LaunchStatus.ok
    dyn = dynamic_check(task, b.lib_path, limits, plan)
    assert dyn.status == LaunchStatus.ok, dyn.message
    assert dyn.launches[0].grid == plan.launches[0].grid and dyn.launches[0].source == "trace"
    task2, b2 = _variant(tmp_path, "liar", PLAN_LIES=1)
    plan2 = static_check(task2, b2, limits)
    dyn2 = dynamic_check(task2, b2.lib_path, limits, plan2)
    assert dyn2.status == LaunchStatus.rejected and "plan_mismatch" in _rules(dyn2)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_without_a_plan_the_trace_alone_is_judged_by_the_same_rules(tmp_path):
    task, b = _variant(tmp_path, "planless_ok")
    _without_plan(task)
    limits = device_limits(b.arch)
    dyn = dynamic_check(task, b.lib_path, limits, static_check(task, b, limits))
    assert dyn.status == LaunchStatus.ok and dyn.launches[0].grid == (1048576 // 256, 1, 1), dyn.message
    task2, b2 = _variant(tmp_path, "planless_tiny", MAX_CTAS=2)
    _without_plan(task2)
    dyn2 = dynamic_check(task2, b2.lib_path, limits, static_check(task2, b2, limits))
    assert _rules(dyn2) == {"grid_too_small"}, dyn2.message
    task3, b3 = _variant(tmp_path, "planless_fewer", MAX_CTAS=512)
    _without_plan(task3)
    parent = LaunchResult(status=LaunchStatus.ok, main_ctas=4096)
    dyn3 = dynamic_check(task3, b3.lib_path, limits, static_check(task3, b3, limits, parent=parent))
    assert _rules(dyn3) == {"cta_collapse"}, dyn3.message


def test_every_other_shape_is_held_to_the_limits_that_make_a_launch_fail(limits):
    """The plan on the shapes beside the main one (tools/judge/_plan_child.py plan_shapes): shared memory that grows
    with the row past the opt-in limit fails on the shape that breaks it, named; a block of 5 threads for a row of 5
    (not a multiple of 32: a cost, judged on the main shape only) and an honest plan pass."""
    from tools.measure.launch import from_plan
    task = load_task(FIX)
    main = {"kernel": "scale_kernel", "grid": [4096, 1, 1], "block": [256, 1, 1], "smem_dynamic_bytes": 0}

    def plan(*others):
        return {"ok": True, "launches": [main], "others": [
            {"shape": shape, "launches": [{"kernel": "scale_kernel", "grid": [g, 1, 1], "block": [b, 1, 1],
                                           "smem_dynamic_bytes": smem}]} for shape, g, b, smem in others]}

    honest = from_plan(task, plan(({"n": 5}, 1, 5, 20), ({"n": 1 << 20}, 4096, 256, 0)), [], limits)
    assert honest.status == LaunchStatus.ok, honest.message
    grown = from_plan(task, plan(({"n": 5}, 1, 5, 20), ({"n": 1 << 20}, 4096, 256, 4 << 20),
                                 ({"n": 1 << 21}, 8192, 256, 8 << 20)), [], limits)
    assert grown.status == LaunchStatus.rejected and [v.rule for v in grown.violations] == ["smem_over_optin"]
    assert "on n=1048576" in grown.violations[0].message and "opt-in limit" in grown.violations[0].message
    huge = from_plan(task, plan(({"n": 3}, 1, 2048, 0)), [], limits)
    assert {v.rule for v in huge.violations} == {"block_too_large", "block_dim_too_large"} and "on n=3" in huge.message

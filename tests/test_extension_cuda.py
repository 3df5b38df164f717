"""The CUDA torch extension (kernels/attention_ext: the seeds' attention kernel as a pybind11
extension with forward(q, k, v, is_causal), no launch_plan).

Here (no GPU): the editable kernel compiled by the real nvcc with the flags torch gives its own
extension builds (no implicit half conversions), in every knob family, and the build graph that
links the binding against torch's CUDA libraries. On the device: the whole path, build, parity on
every shape, the launch geometry from the profiler trace, and a one-line kernel edit that
recompiles the kernel alone.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tools.build.build import build, parse_ptxas, resolve_arch, write_ninja
from tools.task import knob_pattern, load_task
from tools.backends.toolchain import find_cxx, find_ninja, find_nvcc

from tests.userrepo import one_fast

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "kernels" / "attention_ext"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None or find_ninja() is None, reason="nvcc or ninja not found")


def _gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def _copy(tmp: Path, **knobs: int) -> Path:
    dst = tmp / "attention_ext"
    shutil.copytree(SHIPPED, dst, ignore=shutil.ignore_patterns("__pycache__"))
    src = (dst / "attention.cu").read_text()
    for k, v in knobs.items():
        src, n = knob_pattern(k).subn(rf"\g<1>{v}", src)
        assert n == 1, k
    (dst / "attention.cu").write_text(src)
    return dst


def test_the_shipped_task_is_a_cuda_extension_without_a_plan():
    task = load_task(SHIPPED)
    assert task.backend.name == "torch_extension-cuda" and task.spec.ext.entry == "forward"
    assert task.spec.editable == ["attention.cu"] and "binding.cpp" in task.spec.sources
    assert not hasattr(task.module(), "launch_plan")      # the launch check must use the trace
    assert "torch/extension.h" not in (SHIPPED / "attention.cu").read_text()   # the fast file to rebuild


def test_a_cpu_torch_says_it_cannot_build_a_cuda_extension(tmp_path):
    import torch
    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA")
    res = build(load_task(SHIPPED), tmp_path / "build")
    assert res.status.value == "toolchain_missing" and "CPU build" in res.message, res.message
    assert "\n" not in res.message and not (tmp_path / "build").exists()


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("knobs", one_fast({}, {"KV_SPLITS": 4, "USE_TENSOR_CORES": 1, "SMEM_PAD": 8},
                                            {"BLOCK_M": 128, "NUM_WARPS": 8, "SMEM_PAD": 2}))
def test_the_kernel_compiles_with_torchs_extension_flags(tmp_path, knobs):
    """Compile-only: the kernel object alone (linking needs torch's CUDA libraries, absent from a CPU
    torch), through the build graph tools.build.build writes for this form."""
    task = load_task(_copy(tmp_path, **knobs))
    out = tmp_path / "build"
    out.mkdir()
    tools = {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc()}
    edges, commands = write_ninja(task, out, task.root, tools, resolve_arch(task))
    graph = (out / "build.ninja").read_text()
    # torch's own nvcc flags reach the kernel; the binding is compiled as a module named for the task
    assert "-D__CUDA_NO_HALF_OPERATORS__" in graph and "-DTORCH_EXTENSION_NAME=attention_ext_ext" in graph
    link = next(c for c in commands if " -shared" in c)
    assert "-ltorch_cuda" in link and "-ltorch_python" in link and "--no-undefined" not in link
    obj = dict(edges)["attention.cu"]
    proc = subprocess.run([tools["ninja"], "-C", str(out), obj], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels = parse_ptxas((out / (obj + ".log")).read_text())
    assert len(kernels) == 2 and all(k.spill_stores_bytes == 0 for k in kernels), kernels


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_extension_is_correct_its_launch_traced_and_an_edit_recompiles_the_kernel_alone(tmp_path):
    from tools.backends.device import device_limits
    from tools.measure.launch import dynamic_check, static_check
    from tools.measure.parity import run_parity
    from tools.results import BuildStatus, LaunchStatus, ParityStatus

    src = _copy(tmp_path)
    task = load_task(src)
    t0 = time.monotonic()
    first = build(task, tmp_path / "build", src_dir=src)
    first_s = time.monotonic() - t0
    assert first.status == BuildStatus.ok, first.message
    par = run_parity(task, Path(first.lib_path))
    assert par.status == ParityStatus.ok, par.message
    limits = device_limits(first.arch)
    static = static_check(task, first, limits)
    assert static.status == LaunchStatus.ok and static.launches == [], static.message
    dyn = dynamic_check(task, first.lib_path, limits, static)
    assert dyn.status == LaunchStatus.ok, dyn.message
    # the main shape, 32 x 8 x 512: 8 query tiles of 64 rows per (batch, head)
    assert dyn.launches[0].source == "trace" and dyn.main_ctas == 32 * 8 * 8
    cu = src / "attention.cu"
    cu.write_text(cu.read_text().replace("#define SMEM_PAD 0 ", "#define SMEM_PAD 2 ", 1))
    t0 = time.monotonic()
    again = build(task, tmp_path / "build", src_dir=src)
    again_s = time.monotonic() - t0
    assert again.status == BuildStatus.ok and again.steps_run == 2, again.log[-2000:]
    assert run_parity(task, Path(again.lib_path)).status == ParityStatus.ok
    print(f"attention_ext build: first {first_s:.1f} s, after a one-line kernel edit {again_s:.2f} s")


def _ops_copy(tmp: Path) -> Path:
    """attention_ext with its binding registered as a custom op (TORCH_LIBRARY, tests/fixtures/attention_ops)."""
    dst = _copy(tmp)
    shutil.copy(ROOT / "tests" / "fixtures" / "attention_ops" / "binding.cpp", dst / "binding.cpp")
    toml = dst / "task.toml"
    toml.write_text(toml.read_text().replace('entry = "forward"', 'entry = "myattn::forward"')
                    .replace('name = "attention_ext"', 'name = "attention_ops"', 1))
    return dst


def test_the_custom_op_fixture_loads_as_a_torch_library_task(tmp_path):
    task = load_task(_ops_copy(tmp_path))
    assert (task.name, task.backend.op_namespace, task.backend.entry) == ("attention_ops", "myattn", "forward")


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_on_the_gpu_a_torch_library_op_is_judged_traced_and_loads_beside_another_build(tmp_path):
    import torch

    from tools.backends.device import device_limits
    from tools.measure.launch import dynamic_check, static_check
    from tools.measure.parity import run_parity
    from tools.results import BuildStatus, LaunchStatus, ParityStatus

    src = _ops_copy(tmp_path)
    task = load_task(src)
    first = build(task, tmp_path / "b1")
    assert first.status == BuildStatus.ok, first.message
    assert run_parity(task, Path(first.lib_path)).status == ParityStatus.ok
    limits = device_limits(first.arch)
    dyn = dynamic_check(task, first.lib_path, limits, static_check(task, first, limits))
    assert dyn.status == LaunchStatus.ok and dyn.launches[0].source == "trace" and dyn.main_ctas == 32 * 8 * 8, dyn.message
    cu = src / "attention.cu"
    cu.write_text(cu.read_text().replace("#define SMEM_PAD 0 ", "#define SMEM_PAD 2 ", 1))
    again = build(task, tmp_path / "b2", reuse=tmp_path / "b1")
    assert again.status == BuildStatus.ok and again.steps_run == 2 and "(reused:" in again.log, again.log[-2000:]
    be = task.backend
    best, cand = be.load(first.lib_path), be.load(again.lib_path)       # one namespace, two registrations
    q, k, v = (torch.randn(1, 2, 129, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for lib in (best, cand):
        assert torch.allclose(lib.forward(q, k, v, True), want, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_on_the_gpu_a_one_file_cu_op_is_renamed_through_nvcc(tmp_path):
    """The seeds' form with a custom op: kernel and TORCH_LIBRARY in one .cu, so nvcc (cudafe++, cicc and
    the host compiler) reads the renaming header; two builds load side by side."""
    import torch

    from tools.results import BuildStatus
    src = _ops_copy(tmp_path)
    (src / "one.cu").write_text((src / "attention.cu").read_text() + (src / "binding.cpp").read_text())
    (src / "attention.cu").unlink()
    (src / "binding.cpp").unlink()
    toml = src / "task.toml"
    toml.write_text(re.sub(r"(?m)^(sources|editable) = .*$", r'\1 = ["one.cu"]', toml.read_text())
                    .replace('"attention.cu"', '"one.cu"'))
    task = load_task(src)
    libs = []
    for i in (1, 2):
        res = build(task, tmp_path / f"b{i}")
        assert res.status == BuildStatus.ok, res.message
        assert "agent_torch_library.h" in " ".join(res.commands)
        assert "one.cu: split (tools.backends.cu_split)" in res.log and "built whole" not in res.log
        libs.append(task.backend.load(res.lib_path))
    q, k, v = (torch.randn(1, 2, 65, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert all(torch.allclose(lib.forward(q, k, v, False), want, atol=2e-3, rtol=2e-3) for lib in libs)


def _load_copy(task, lib_path: str, tmp: Path, name: str):
    """A build loaded from its own path (a rebuild in one build folder reuses the file name, and a
    process dlopens a path once)."""
    dst = tmp / f"{name}.so"
    shutil.copy(lib_path, dst)
    return task.backend.load(str(dst))


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_seeds_one_file_form_builds_in_halves_and_a_kernel_edit_leaves_the_torch_half(tmp_path):
    """tests/fixtures/one_file_cu: torch's headers, a template and a plain kernel, a launcher and
    PYBIND11_MODULE in one .cu, built as two halves (tools.backends.cu_split): correct in both dtypes and every
    shape, its launches traced, a kernel edit compiles the kernels' half alone, a grid macro edit the
    torch half too, and a half that does not compile falls back to the file built whole."""
    import torch

    from tools.backends.device import device_limits
    from tools.measure.launch import dynamic_check, static_check
    from tools.measure.parity import run_parity
    from tools.results import BuildStatus, LaunchStatus, ParityStatus
    src = tmp_path / "task"
    shutil.copytree(ROOT / "tests" / "fixtures" / "one_file_cu", src)
    task, cu = load_task(src), src / "scale.cu"
    text = cu.read_text()
    first = build(task, tmp_path / "b")
    assert first.status == BuildStatus.ok, first.message
    assert "scale.cu: split (tools.backends.cu_split)" in first.log and "built whole" not in first.log, first.log[-3000:]
    assert run_parity(task, Path(first.lib_path)).status == ParityStatus.ok
    lib = _load_copy(task, first.lib_path, tmp_path, "first")
    x = torch.randn(70001, device="cuda")
    assert torch.equal(lib.forward(x), 2 * x + 1)
    h = x.half()
    assert torch.allclose(lib.forward(h).float(), (2 * h.float() + 1).half().float(), atol=1e-2, rtol=1e-3)
    limits = device_limits(first.arch)
    static = static_check(task, first, limits)
    dyn = dynamic_check(task, first.lib_path, limits, static)
    assert dyn.status == LaunchStatus.ok and dyn.launches[0].source == "trace", dyn.message
    assert dyn.main_ctas == 1048576 // 256
    timings = {}
    for what, edit in (("kernel knob", lambda t: t.replace("#define USE_LDG 0", "#define USE_LDG 1")),
                       ("kernel body, lines added", lambda t: t.replace("  int i = (blockIdx.x", "  // a\n  // b\n  int i = (blockIdx.x")),
                       ("grid macro", lambda t: t.replace("#define VEC 1 ", "#define VEC 4 "))):
        cu.write_text(edit(cu.read_text()))
        t0 = time.monotonic()
        res = build(task, tmp_path / "b")
        timings[what] = time.monotonic() - t0
        assert res.status == BuildStatus.ok, res.message
        host_compiled = "== scale.cu.host.cpp (compiled) ==" in res.log
        assert host_compiled == (what == "grid macro"), res.log[-3000:]
        assert "== scale.cu.kernels.cu (compiled) ==" in res.log
        assert run_parity(task, Path(res.lib_path)).status == ParityStatus.ok, what
        assert torch.equal(_load_copy(task, res.lib_path, tmp_path, what.replace(" ", "_")[:10]).forward(x), 2 * x + 1)
    print("one-file extension rebuilds:", {k: round(v, 2) for k, v in timings.items()})
    # a helper of the torch code that needs a header only torch brought: the kernels' half does not
    # compile alone, and the file is built whole (slowly, and right)
    cu.write_text(text.replace("static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }",
                               "static inline int ceil_div(int a, int b) { std::vector<int> v{a, b}; "
                               "return (v[0] + v[1] - 1) / v[1]; }"))
    res = build(task, tmp_path / "b")
    assert res.status == BuildStatus.ok and "did not build; built whole" in res.log, res.message
    assert torch.equal(_load_copy(task, res.lib_path, tmp_path, "whole").forward(x), 2 * x + 1)


def test_the_default_task_on_a_gpu_is_still_the_ctypes_one():
    """attention_ext sorts before attention_fwd; the default stays the task BENCHMARKS.md measures."""
    from tools.task import first_fitting_task
    assert first_fitting_task(ROOT / "kernels", cuda=True) == ROOT / "kernels" / "attention_fwd"
    assert first_fitting_task(ROOT / "kernels", cuda=False) == ROOT / "kernels" / "matmul_cpu"

"""tools/cu_split.py: the seeds' one-file CUDA extension built as two halves, the kernels without
torch's headers (nvcc, 1-2 s) and the torch code (the C++ compiler, again only when its text changes).

Text tests run everywhere; the compile tests need nvcc (CPU CI has it); the GPU test (the halves
loaded, judged and rebuilt after an edit) is in tests/test_extension_cuda.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.build import resolve_arch, write_ninja
from tools.cu_split import NoSplit, Split, prepare, split
from tools.task import load_task
from tools.toolchain import find_cxx, find_ninja, find_nvcc

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "one_file_cu"
ATTENTION = ROOT / "kernels" / "attention_ext"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None or find_ninja() is None, reason="needs nvcc and ninja")


def _scale() -> str:
    return (FIXTURE / "scale.cu").read_text()


def _attention_one_file() -> str:
    """attention_ext as its user first had it: the kernel and the binding in one .cu."""
    return (ATTENTION / "attention.cu").read_text() + (ATTENTION / "binding.cpp").read_text()


def _set(text: str, name: str, value: int) -> str:
    out, n = re.subn(rf"(?m)^#define {name} \d+", f"#define {name} {value}", text)
    assert n == 1, name
    return out


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


def test_the_seeds_form_splits_into_kernels_without_torch_and_torch_code_without_launches():
    got = split(_scale(), "scale.cu")
    assert isinstance(got, Split) and got.launches == 2
    # the kernels' half: every kernel and device function, no torch header, no torch code
    assert "torch/extension.h" not in got.kernels and "ATen/" not in got.kernels and "PYBIND11" not in got.kernels
    assert "__global__ void half_kernel" in got.kernels and "apply(Scale s" in got.kernels
    assert "torch::Tensor forward" not in got.kernels
    # the kernels' addresses, one per launch site, a template kernel instantiated where it is defined
    assert 'extern "C" const void* agent_cu_split_fn_1(void) { return (const void*)&scale_kernel<VEC>; }' in got.kernels
    # the torch code: no launch syntax nor device code left for the C++ compiler, torch/extension.h first
    assert "<<<" not in got.host and "__global__" not in got.host and "__device__" not in got.host
    assert got.host.splitlines()[1] == "#include <torch/extension.h>"
    assert "void half_kernel(const __half* x, __half* y, int n);" in got.host       # declared, not defined
    assert "agent_cu_split::launch(agent_cu_split_fn_1(), (decltype(&scale_kernel<VEC>))nullptr, " \
           "agent_cu_split::Config(dim3(ceil_div(n, BLOCK * VEC)), BLOCK, 0, stream), x.data_ptr<float>()" in got.host
    # what the torch code reads comes along (a type, an inline helper, the macros of its grid); what
    # only the kernels read does not
    assert "struct Scale" in got.host and "static inline int ceil_div" in got.host
    assert "#define BLOCK 256" in got.host and "#define VEC 1" in got.host and "USE_LDG" not in got.host


def test_line_directives_name_the_users_file_and_lines_in_both_halves():
    text, got = _scale(), split(_scale(), "/repo/scale.cu")
    for half, needle in ((got.host, "torch::Tensor forward"), (got.kernels, "__global__ void half_kernel")):
        lines = half.splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith(needle))
        assert lines[at - 1] == f'#line {_line_of(text, needle)} "/repo/scale.cu"'
    # a launch rewritten over several lines keeps the lines after it where they were
    host = got.host.splitlines()
    start = next(i for i, ln in enumerate(host) if ln.startswith("torch::Tensor forward"))
    check = next(i for i, ln in enumerate(host) if "C10_CUDA_KERNEL_LAUNCH_CHECK" in ln)
    assert check - start == _line_of(text, "C10_CUDA_KERNEL_LAUNCH_CHECK") - _line_of(text, "torch::Tensor forward")


def test_a_kernel_only_edit_leaves_the_torch_half_as_it_was_and_a_grid_macro_does_not():
    before = split(_scale(), "scale.cu")
    kernel_knob = split(_set(_scale(), "USE_LDG", 1), "scale.cu")
    body = split(_scale().replace("s.a * x + s.b", "fmaf(s.a, x, s.b)"), "scale.cu")
    assert kernel_knob.host == before.host and body.host == before.host
    assert kernel_knob.kernels != before.kernels and body.kernels != before.kernels
    grid = split(_set(_scale(), "BLOCK", 512), "scale.cu")            # the launcher's grid reads BLOCK
    assert grid.host != before.host


def test_the_attention_kernel_in_one_file_keeps_every_knob_out_of_its_torch_half():
    """attention_ext's binding calls the kernel's extern "C" launcher: the torch half declares it and
    reads none of the six knobs, so no knob move recompiles torch's headers."""
    text = _attention_one_file()
    base = split(text, "one.cu")
    assert isinstance(base, Split) and base.launches == 0
    for name, value in (("BLOCK_M", 128), ("NUM_WARPS", 8), ("KV_SPLITS", 4), ("SMEM_PAD", 8), ("USE_TENSOR_CORES", 1)):
        moved = split(_set(text, name, value), "one.cu")
        assert moved.host == base.host and moved.kernels != base.kernels, name
    assert "USE_TENSOR_CORES" not in base.host and "mma.h" not in base.host
    assert base.kernels.count("__global__") == text.count("__global__")
    assert 'extern "C" int attention_fwd_run(' in base.host and "{" not in base.host.split("attention_fwd_run(")[1].split(";")[0]


@pytest.mark.parametrize("text, why", [
    ("#include <torch/extension.h>\n__global__ void k(torch::PackedTensorAccessor32<float, 1> x) { x[0] = 1; }\n"
     "void f(torch::Tensor t) { k<<<1, 1>>>(t.packed_accessor32<float, 1>()); }\n",
     "x.cu:2: k is __global__ code that names torch's types"),
    ("#include <torch/extension.h>\nint calls = 0;\n__global__ void k(float* x) { x[0] = 1; }\n"
     "void bump() { calls++; }\nvoid f(torch::Tensor t) { calls++; k<<<1, 1>>>(t.data_ptr<float>()); }\n",
     "x.cu:2: calls is a variable both the kernels and the torch code use"),
    ("#include <torch/extension.h>\ntemplate <int B> __global__ void k(float* x) { x[0] = B; }\n"
     "void f(torch::Tensor t) { cudaFuncSetAttribute(k<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 0); "
     "k<4><<<1, 1>>>(t.data_ptr<float>()); }\n",
     "x.cu:2: the torch code names template kernel k outside a launch"),
    ("#include <torch/extension.h>\n__device__ float twice(float v) { return 2 * v; }\n"
     "void f(torch::Tensor t) { twice(1.0f); }\n",
     "x.cu:2: the torch code names twice, __device__ on the GPU only"),
    ("__global__ void k(float* x) { x[0] = 1; }\n", "no torch code"),
])
def test_a_split_that_could_change_the_program_is_refused_with_the_reason(text, why):
    got = split(text, "x.cu")
    assert isinstance(got, NoSplit) and got.reason.startswith(why), got


def _task_copy(tmp: Path, text: str | None = None) -> Path:
    dst = tmp / "task"
    shutil.copytree(FIXTURE, dst)
    if text is not None:
        (dst / "scale.cu").write_text(text)
    return dst


@pytest.mark.nvcc
@needs_nvcc
def test_the_kernels_half_compiles_alone_through_the_build_graph_with_the_users_lines_in_errors(tmp_path):
    """Compile-only (a CPU torch has no CUDA libraries to link): the build graph gets two edges for the
    file, the kernels' half compiles with nvcc in seconds, and an error in a kernel is reported at the
    line of the user's file."""
    task = load_task(_task_copy(tmp_path))
    out = tmp_path / "build"
    out.mkdir()
    halves, note = prepare(task, task.root, out)
    assert set(halves) == {"scale.cu"} and "split" in note
    tools = {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc()}
    edges, commands = write_ninja(task, out, task.root, tools, resolve_arch(task), None, None, halves)
    objs = dict(edges)
    assert set(objs) == {"scale.cu.kernels.cu", "scale.cu.host.cpp"}
    assert any(c.startswith("nvcc ") and c.endswith(" -c scale.cu.kernels.cu") for c in commands)
    proc = subprocess.run([tools["ninja"], "-C", str(out), objs["scale.cu.kernels.cu"]], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    ptxas = (out / (objs["scale.cu.kernels.cu"] + ".log")).read_text()
    assert "half_kernel" in ptxas and "scale_kernel" in ptxas
    # the user's mistake in a kernel body: nvcc names scale.cu and its line, not the generated half
    bad = _scale().replace("int i = blockIdx.x * blockDim.x + threadIdx.x;", "int i = blockIdx.x * blockDim.x + threadIdx.x + undefined_name;")
    (task.root / "scale.cu").write_text(bad)
    halves, _ = prepare(task, task.root, out)
    write_ninja(task, out, task.root, tools, resolve_arch(task), None, None, halves)
    proc = subprocess.run([tools["ninja"], "-C", str(out), objs["scale.cu.kernels.cu"]], capture_output=True,
                          text=True, timeout=600)
    line = _line_of(bad, "undefined_name")
    assert proc.returncode != 0 and f"scale.cu({line}): error" in proc.stdout and "undefined_name" in proc.stdout


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_both_halves_compile_and_link_into_one_library_with_a_launch_per_site(tmp_path):
    """The torch half too, with the C++ compiler (a CPU torch lacks ATen/cuda's headers: the stream
    comes from the runtime instead here), then one shared object holding both halves' symbols."""
    text = (_scale().replace("#include <ATen/cuda/CUDAContext.h>\n", "").replace("#include <c10/cuda/CUDAException.h>\n", "")
            .replace("at::cuda::getCurrentCUDAStream()", "(cudaStream_t)0")
            .replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", 'TORCH_CHECK(cudaGetLastError() == cudaSuccess, "launch");'))
    task = load_task(_task_copy(tmp_path, text))
    out = tmp_path / "build"
    out.mkdir()
    halves, _ = prepare(task, task.root, out)
    tools = {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc()}
    edges, _ = write_ninja(task, out, task.root, tools, resolve_arch(task), None, None, halves)
    objs = [o for _, o in edges]
    proc = subprocess.run([tools["ninja"], "-C", str(out), *objs], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    syms = subprocess.run(["nm", str(out / objs[1])], capture_output=True, text=True).stdout
    assert "U agent_cu_split_fn_0" in syms and "U agent_cu_split_fn_1" in syms and "cudaLaunchKernel" in syms
    ksyms = subprocess.run(["nm", str(out / objs[0])], capture_output=True, text=True).stdout
    assert "T agent_cu_split_fn_0" in ksyms and "T agent_cu_split_fn_1" in ksyms


def test_lines_added_to_a_kernel_do_not_rewrite_the_torch_half(tmp_path):
    """Its #line numbers move, its code does not: the file is left as it was, so that ninja does not
    compile torch's headers again; a change of its code is written."""
    task = load_task(_task_copy(tmp_path))
    out = tmp_path / "build"
    host = prepare(task, task.root, out)[0]["scale.cu"].host
    first = host.read_text()
    (task.root / "scale.cu").write_text(_scale().replace("__device__ __forceinline__", "// a note\n// and another\n"
                                                         "__device__ __forceinline__"))
    assert prepare(task, task.root, out)[0]["scale.cu"].host.read_text() == first
    (task.root / "scale.cu").write_text(_set(_scale(), "BLOCK", 128))
    assert "#define BLOCK 128" in prepare(task, task.root, out)[0]["scale.cu"].host.read_text()

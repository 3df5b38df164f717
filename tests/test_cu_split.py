"""tools/backends/cu_split.py: the seeds' one-file CUDA extension built as two halves, the kernels without
torch's headers (nvcc, 1-2 s) and the torch code (the C++ compiler, again only when its text changes).

Text tests run everywhere; the compile tests need nvcc (CPU CI has it); the GPU test (the halves
loaded, judged and rebuilt after an edit) is in tests/test_extension_cuda.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.build.build import resolve_arch, write_ninja
from tools.backends.cu_split import NoSplit, Split, prepare, split
from tools.task import load_task
from tools.backends.toolchain import find_cxx, find_ninja, find_nvcc

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


def test_the_items_are_read_by_the_parser_where_brackets_mislead():
    """Issue 65: a brace-initialised constant list (`{2.0f, 1.0f}` is not a body) and a variable of an unnamed struct are
    one item each, to their `;`, with every name they declare: read by the brackets, the first was cut at its first
    `}` and lost its `;` (the halves then did not compile: built whole), the second was two items named `struct`."""
    from tools.backends.cu_scan import scan
    text = _scale().replace("static inline int ceil_div", "static const Scale kTwice{2.0f, 1.0f}, kOnce{1.0f, 0.0f};\n"
                            "static struct { int launches; } stats_;\nstatic inline int ceil_div")
    items = {it.text: it.names for it in scan(text) if it.kind == "code"}
    assert items["static const Scale kTwice{2.0f, 1.0f}, kOnce{1.0f, 0.0f};"] == {"kTwice", "kOnce"}, items
    assert items["static struct { int launches; } stats_;"] == {"stats_"}, items
    got = split(text.replace("Scale{2.0f, 1.0f}", "kTwice"), "scale.cu")
    assert isinstance(got, Split), got
    assert "static const Scale kTwice{2.0f, 1.0f}, kOnce{1.0f, 0.0f};" in got.host     # copied whole, `;` and all


def test_a_launch_is_read_by_the_parser_whatever_names_the_kernel():
    from tools.backends.cu_scan import launches_in, mask
    body = ("void go(float* x, cudaStream_t s) {\n  auto* table[2] = {k0, k1};\n"
            "  ns::k<float, 64><<<dim3(2, 1), 128, 0, s>>>(x, /* n */ 3);\n  (k0)<<<1, 32>>>(x);\n}\n")
    got = [(ln.callee, ln.config, ln.args) for ln in launches_in(mask(body), body)]
    assert got == [("ns::k<float, 64>", "dim3(2, 1), 128, 0, s", "x, /* n */ 3"), ("(k0)", "1, 32", "x")], got


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
    ("#include <torch/extension.h>\ntemplate <typename T> __global__ void k(T* x) { x[0] = 1; }\n"
     "void f(torch::Tensor t) {\n  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), \"f\", ([&] {\n"
     "    k<scalar_t><<<1, 1>>>(t.data_ptr<scalar_t>()); }));\n}\n",
     "x.cu:5: the launch of k<scalar_t> takes scalar_t from the torch code"),
    ("#include <torch/extension.h>\nnamespace ops {\n__global__ void k(float* x) { x[0] = 1; }\n}\n"
     "void f(torch::Tensor t) { ops::k<<<1, 1>>>(t.data_ptr<float>()); }\n",
     "x.cu:2: the torch code names ops, in a namespace or extern \"C\" block, which the split does not take apart"),
    ("#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1; }\n"
     'extern "C" {\nvoid launch(float* x) { k<<<1, 1>>>(x); }\n}\n'
     "void f(torch::Tensor t) { launch(t.data_ptr<float>()); }\n",
     "x.cu:3: the torch code names launch, in a namespace or extern \"C\" block"),
    # the judged build must be the user's: torch code that asks which compiler reads it would take the
    # other branch under the C++ compiler (a faster path that nvcc's build, the user's, never runs)
    ("#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1; }\n"
     "torch::Tensor f(torch::Tensor t) {\n#ifndef __CUDACC__\n  return t.clone();\n#endif\n"
     "  k<<<1, 1>>>(t.data_ptr<float>()); return t; }\n",
     "line 3: the torch code reads __CUDACC__"),
    ("#include <torch/extension.h>\n#if defined(__CUDA_ARCH_LIST__)\n#define FAST 1\n#endif\n"
     "__global__ void k(float* x) { x[0] = 1; }\nvoid f(torch::Tensor t) { k<<<FAST, 1>>>(t.data_ptr<float>()); }\n",
     "line 2: the torch code reads __CUDA_ARCH_LIST__"),
])
def test_a_split_that_could_change_the_program_is_refused_with_the_reason(text, why):
    got = split(text, "x.cu")
    assert isinstance(got, NoSplit) and got.reason.startswith(why), got


def _cpu_torch_variant() -> str:
    """The fixture without ATen/cuda's and c10/cuda's headers, which a CPU torch does not ship: the
    stream from the runtime, the checks through TORCH_CHECK."""
    return (_scale().replace("#include <ATen/cuda/CUDAContext.h>\n", "").replace("#include <c10/cuda/CUDAException.h>\n", "")
            .replace("at::cuda::getCurrentCUDAStream()", "(cudaStream_t)0")
            .replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", 'TORCH_CHECK(cudaGetLastError() == cudaSuccess, "launch");')
            .replace("C10_CUDA_CHECK(cudaFuncSetAttribute(", "TORCH_CHECK(cudaSuccess == cudaFuncSetAttribute("))


def _task_copy(tmp: Path, text: str | None = None, folder: str = "task") -> Path:
    dst = tmp / folder
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
    assert any(c.startswith("nvcc ") and " -c scale.cu.kernels.cu -o obj/" in c for c in commands)
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


def _pch(torch_pch, halves: dict) -> tuple[Path, list[str]] | None:
    """write_ninja's `pch` as a build gives it: the run's header folder and the torch halves that start with it."""
    return (Path(torch_pch), [f"{rel}.host.cpp" for rel, h in halves.items() if h.pch]) if torch_pch else None


@pytest.fixture(scope="session")      # not module: see tests/test_extension.py's `built`; the tests read it
def both_halves(tmp_path_factory, torch_pch):
    """The fixture's split compiled once a worker: both halves with the C++ compiler and nvcc (a CPU torch lacks ATen/cuda's
    headers: the stream comes from the runtime instead here), the torch half with the run's precompiled
    torch/extension.h as a build serves it (16 s of torch's headers without it, 8 s with it). Returns the build
    folder, its objects and ninja's answer."""
    tmp = tmp_path_factory.mktemp("halves")
    task = load_task(_task_copy(tmp, _cpu_torch_variant()))
    out = tmp / "build"
    out.mkdir()
    halves, _ = prepare(task, task.root, out)
    tools = {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc()}
    edges, _ = write_ninja(task, out, task.root, tools, resolve_arch(task), None, _pch(torch_pch, halves), halves)
    objs = [o for _, o in edges]
    proc = subprocess.run([tools["ninja"], "-C", str(out), *objs], capture_output=True, text=True, timeout=900)
    return out, objs, proc


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_both_halves_compile_and_link_into_one_library_with_a_launch_per_site(both_halves):
    """The torch half too, then one shared object holding both halves' symbols."""
    out, objs, proc = both_halves
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



def _check(repo: Path) -> str:
    """`agent check t` in `repo`, its output on one line (a wide terminal, so rich wraps nothing)."""
    from tests.userrepo import agent
    proc = agent(repo, "check", "t", timeout=600, env={"COLUMNS": "400"})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return " ".join((proc.stdout + proc.stderr).split())


def test_agent_check_says_why_a_one_file_cu_is_built_whole_and_is_quiet_when_it_is_split(tmp_path):
    """Through the real entry point, in a user's repository: the fixture as shipped (split) gets no
    rebuild note; with a kernel that takes a torch type, the note names the line that stops the split.
    (A CPU torch stops the build itself; the note does not need it.)"""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo / "t")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert "recompiles them" not in _check(repo)
    cu = repo / "t" / "scale.cu"
    cu.write_text(cu.read_text().replace("__global__ void half_kernel(const __half* x, __half* y, int n) {",
                                         "__global__ void half_kernel(const __half* x, __half* y, int n, "
                                         "torch::PackedTensorAccessor32<float, 1> acc) {"))
    out = _check(repo)
    line = _line_of(cu.read_text(), "__global__ void half_kernel")
    assert "every candidate recompiles them" in out and "the build could not split scale.cu into its kernels and " \
        f"its torch code: scale.cu:{line}: half_kernel is __global__ code that names torch's types" in out, out


def test_a_header_of_the_users_that_asks_for_nvcc_stops_the_split(tmp_path):
    """The torch half includes the user's headers: one (or one it includes) that tests nvcc's macros
    would read differently there, so the file is built whole."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "deep.h").write_text("#pragma once\n#ifdef __CUDACC__\ninline int fast() { return 0; }\n#endif\n")
    (tmp_path / "inc" / "util.h").write_text('#pragma once\n#include "deep.h"\n')   # beside it
    text = ('#include <torch/extension.h>\n#include "inc/util.h"\n__global__ void k(float* x) { x[0] = 1; }\n'
            "void f(torch::Tensor t) { k<<<1, 1>>>(t.data_ptr<float>()); }\n")
    got = split(text, str(tmp_path / "x.cu"))
    assert isinstance(got, NoSplit) and got.reason.startswith("inc/deep.h: the torch code reads __CUDACC__"), got
    # the same header reached with angle brackets through the build's -I of the task's folder
    (tmp_path / "util.h").write_text("#pragma once\n#ifdef __CUDACC__\ninline int fast() { return 0; }\n#endif\n")
    angle = split(text.replace('#include "inc/util.h"', "#include <util.h>"), str(tmp_path / "x.cu"))
    assert isinstance(angle, NoSplit) and angle.reason.startswith("util.h: the torch code reads __CUDACC__"), angle
    (tmp_path / "inc" / "deep.h").write_text("#pragma once\ninline int fast() { return 0; }\n")
    assert isinstance(split(text, str(tmp_path / "x.cu")), Split)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_another_build_links_the_torch_half_an_earlier_build_compiled_from_the_same_code(both_halves, tmp_path,
                                                                                        torch_pch):
    """A sweep's configuration or a run after `agent check` builds in a folder of its own from a source
    folder of its own: it links the earlier torch half where the code is the same (a kernel edit, lines
    moved), and compiles its own where a macro the torch code reads changed."""
    from tools.backends.cu_split import same_code
    from tools.build.reuse import reusable_halves
    tools = {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": find_nvcc()}

    def graph(task_dir: Path, out: Path):
        task = load_task(task_dir)
        out.mkdir(exist_ok=True)
        halves, _ = prepare(task, task.root, out)
        write_ninja(task, out, task.root, tools, resolve_arch(task), None, _pch(torch_pch, halves), halves)
        return {"scale.cu.host.cpp": ("obj/scale.cu.host.cpp.o", halves["scale.cu"].host)}

    first, _, proc = both_halves          # the earlier build: the fixture's, compiled once for this worker
    assert proc.returncode == 0, proc.stdout[-3000:]
    want = {"scale.cu.host.cpp": (first / "obj" / "scale.cu.host.cpp.o").resolve()}
    for i, (edit, reused) in enumerate([(lambda t: t, True),
                                        (lambda t: _set(t, "USE_LDG", 1), True),
                                        (lambda t: t.replace("struct Scale {", "// moved\n\nstruct Scale {"), True),
                                        (lambda t: _set(t, "BLOCK", 512), False)]):
        src = _task_copy(tmp_path, edit(_cpu_torch_variant()), f"s{i}")
        out = tmp_path / f"o{i}"
        halves = graph(src, out)
        got = reusable_halves([tmp_path / "none", first], tools["ninja"], halves, src, out / "build.ninja", same_code)
        assert got == (want if reused else {}), i

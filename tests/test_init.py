"""`agent init` (issue 45): a task from a kernel's extern "C" function and a Python reference, in a fresh git
repository outside this project, through the real CLI: the generated task.toml's [signature] and two-line task.py
(tools/signature.py), `agent check`, a 5-iteration `agent optimize`; a row reduction with inputs of two dtypes, a
float scalar and an output of another shape; bad input in one line with nothing written; a kernel or a candidate
whose function no longer matches the declaration refused before it is built or called."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.userrepo import agent as _agent
from tests.userrepo import fast_bench, git


def agent(cwd: Path, *args: str, timeout: float = 600, fresh: bool = True):
    """The CLI as the installed `agent` script runs it: the user's repository (with a `tools/` package of its own
    here) not on sys.path; nothing the agent starts may import the user's package in place of this project's.
    `fresh` False: forked from the tests' warm parent instead (tests/userrepo.py), where this project's packages are
    imported already: for a test of what the command answers, not of what it imports (2-3 s of CPU less a call)."""
    return _agent(cwd, *args, timeout=timeout, safe_path=fresh)

FMA = """#include <cstdint>
#define UNROLL 1
// out = x * y * alpha + y, UNROLL elements a step, then the tail
extern "C" void fma_kernel(const float* x, const float* y, float* out, int n, float alpha) {
    int i = 0;
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; ++u) out[i + u] = x[i + u] * y[i + u] * alpha + y[i + u];
    for (; i < n; ++i) out[i] = x[i] * y[i] * alpha + y[i];
}
"""
ROWS = """#include <cstdint>
// s[i] = scale * sum_j a[i, j] * w[j]: a in float64, w in float32, one output per row
extern "C" void rows(const double* a, const float* w, double* s, int64_t M, int64_t N, double scale) {
    for (int64_t i = 0; i < M; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < N; ++j) acc += a[i * N + j] * (double)w[j];
        s[i] = scale * acc;
    }
}
"""
REF = """import torch


def fma(x, y, alpha=1.0):
    return x * y * alpha + y


def rows(a, w, scale=1.0):
    return (a * w.to(a.dtype)).sum(dim=1) * scale


def wrong_shape(x, y, alpha=1.0):
    return (x * y).sum()
"""


def _user(tmp_path: Path) -> Path:
    """A user's repository: a reference module and two kernels beside it, committed, nothing of this project's."""
    root = tmp_path / "user"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "__init__.py").write_text("")
    (root / "ops" / "ref.py").write_text(REF)
    (root / "tools").mkdir()      # a package of the user's named as one of this project's: it must not shadow it
    (root / "tools" / "__init__.py").write_text("raise ImportError('the user tools package was imported')\n")
    (root / "src").mkdir()
    (root / "src" / "fma.cpp").write_text(FMA)
    (root / "src" / "rows.cpp").write_text(ROWS)
    (root / "README.md").write_text("the user's project\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user")
    return root


@pytest.mark.slow
def test_init_then_check_then_optimize_in_a_fresh_repository(tmp_path):
    root = _user(tmp_path)
    r = agent(root, "init", "fma", "--cpp", "src/fma.cpp", "--reference", "ops.ref:fma", "--scalar", "alpha=0.5",
              "--knob", "UNROLL=1,2,3,4,8,16")
    assert r.returncode == 0, r.stderr + r.stdout
    task = root / "kernels" / "fma"
    assert sorted(p.name for p in task.iterdir()) == ["fma.cpp", "task.py", "task.toml"]
    spec = tomllib.loads((task / "task.toml").read_text())
    assert [(a["name"], a["kind"]) for a in spec["signature"]["args"]] == [
        ("x", "input"), ("y", "input"), ("out", "output"), ("n", "int"), ("alpha", "float")]
    assert spec["shapes"][0] == {"n": 1 << 20} and "ctypes" not in (task / "task.py").read_text()
    fast_bench(task)           # init's own [bench] is read above; the run below tests the path, not a speed
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the fma task")
    r = agent(root, "check", "kernels/fma", timeout=600)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stderr + r.stdout
    r = agent(root, "optimize", "kernels/fma", "--iters", "5", "--target", "100x", "--proposer", "heuristic", "--quiet",
              timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    [run] = [p for p in (root / "runs").iterdir() if (p / "iterations.jsonl").exists()]
    recs = [json.loads(x) for x in (run / "iterations.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(x["decision"] in ("kept", "reverted") for x in recs), [x["reason"] for x in recs]
    assert git(root, "status", "--porcelain", "--untracked-files=no") == ""


def test_an_init_task_says_which_function_is_timed(tmp_path):
    """A task made by `agent init` has a two-line task.py, no timing_reference docstring: the prompt names the user's
    function from [signature] instead, and that parity's truth is the same function in float64 (issue 63: the
    model read the parity reference as the timed one)."""
    from agent.llm.context import timing_doc
    from tools.task import load_task
    root = _user(tmp_path)
    r = agent(root, "init", "fma", "--cpp", "src/fma.cpp", "--reference", "ops.ref:fma", "--scalar", "alpha=0.5")
    assert r.returncode == 0, r.stderr + r.stdout
    said = timing_doc(load_task(root / "kernels" / "fma"))
    assert said is not None and said.startswith("`ops.ref:fma` (task.toml [signature] reference"), said
    assert "task.py" not in said, said
    assert "x float32, y float32" in said and "float64" in said, said


@pytest.mark.slow
def test_a_row_reduction_with_two_dtypes_a_scalar_and_an_output_of_another_shape(tmp_path):
    root = _user(tmp_path)
    r = agent(root, "init", "rows", "--cpp", "src/rows.cpp", "--reference", "ops.ref:rows", "--shape", "a=M,N",
              "--shape", "w=N", "--shape", "s=M", "--size", "M=300", "--size", "N=500", "--scalar", "scale=0.25",
              fresh=False)      # the fresh interpreter's imports are the test above's: this one is of what init answers
    assert r.returncode == 0, r.stderr + r.stdout
    spec = tomllib.loads((root / "kernels" / "rows" / "task.toml").read_text())
    args = {a["name"]: a for a in spec["signature"]["args"]}
    assert args["a"]["dtype"] == "float64" and args["w"]["dtype"] == "float32" and args["s"]["shape"] == ["M"]
    assert args["M"]["ctype"] == "int64_t" and args["scale"] == {"name": "scale", "kind": "float", "value": 0.25,
                                                                   "ctype": "double"}
    r = agent(root, "check", "kernels/rows", timeout=600, fresh=False)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stderr + r.stdout
    # the kernel changed after init: its size parameters are int now, the declaration says int64_t
    (root / "kernels" / "rows" / "rows.cpp").write_text(ROWS.replace("int64_t M, int64_t N", "int M, int N"))
    r = agent(root, "check", "kernels/rows", timeout=600, fresh=False)
    assert r.returncode != 0 and "signature" in r.stderr + r.stdout and "int64_t" in r.stderr + r.stdout, r.stdout


@pytest.mark.slow
def test_a_candidate_that_changes_the_function_is_refused_before_its_build(tmp_path):
    """The generated task.py calls the declared ABI: a candidate whose function takes a long where int was
    declared would be called with the wrong argument; the loop refuses the patch before it builds."""
    from agent.proposal import Edit, PredictedEffect, Proposal
    from agent.records.store import read_iterations
    root = _user(tmp_path)
    assert agent(root, "init", "fma", "--cpp", "src/fma.cpp", "--reference", "ops.ref:fma", fresh=False).returncode == 0
    fast_bench(root / "kernels" / "fma")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the fma task")
    p = Proposal(hypothesis="64-bit sizes", predicted=PredictedEffect(metric="time.median_ms", direction="down",
                                                                       speedup=1.1),
                 edits=[Edit(file="fma.cpp", search="float* out, int n,", replace="float* out, long n,")])
    (tmp_path / "props.json").write_text(json.dumps([p.model_dump()]))
    r = agent(root, "optimize", "kernels/fma", "--proposer", "replay", "--replay", str(tmp_path / "props.json"),
              "--iters", "1", "--target", "100x", "--quiet", timeout=600, fresh=False)
    assert r.returncode == 0, r.stderr + r.stdout
    [run] = [p for p in (root / "runs").iterdir() if (p / "iterations.jsonl").exists()]
    [it] = read_iterations(run)
    # the patched task is loaded before anything builds (load_task checks [signature] against the kernel)
    assert it.outcome.value == "patch_did_not_apply" and it.build is None and it.commit_sha is None, it.reason
    assert "signature" in it.reason and "parameter 4 (long n)" in it.reason and "ctype int" in it.reason, it.reason


def _fails(root: Path, *args: str, needle: str, fresh: bool = False) -> None:
    before = git(root, "status", "--porcelain", "--untracked-files=all")
    r = agent(root, "init", *args, timeout=300, fresh=fresh)
    assert r.returncode == 2 and needle in r.stderr, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr
    assert not (root / "kernels").exists() and git(root, "status", "--porcelain", "--untracked-files=all") == before


def test_bad_input_is_one_line_and_nothing_is_written(tmp_path):
    root = _user(tmp_path)
    # the first as the installed script runs (a fresh interpreter, the user's repository off the path), the rest forked
    _fails(root, "fma", "--cpp", "src/fma.cpp", "--reference", "ops.nothere:fma", needle="does not import", fresh=True)
    _fails(root, "fma", "--cpp", "src/fma.cpp", "--reference", "ops.ref:wrong_shape", needle="--shape")
    _fails(root, "fma", "--cpp", "src/missing.cpp", "--reference", "ops.ref:fma", needle="no such file")
    _fails(root, "fma", "--cpp", "src/fma.cpp", "--reference", "fma", needle="MODULE:FUNCTION")
    _fails(root, "rows", "--cpp", "src/rows.cpp", "--reference", "ops.ref:rows", needle="--shape a=M,N")
    two = root / "src" / "two.cpp"
    two.write_text(FMA.replace("const float* y", "float* y"))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "two outputs?")
    _fails(root, "fma", "--cpp", "src/two.cpp", "--reference", "ops.ref:fma", needle="--output")
    outside = tmp_path / "nogit"
    outside.mkdir()
    r = agent(outside, "init", "fma", "--cpp", str(root / "src" / "fma.cpp"), "--reference", "ops.ref:fma", fresh=False)
    assert r.returncode == 2 and "not in a git repository" in r.stderr, r.stderr


def test_the_generated_functions_follow_the_declaration(tmp_path):
    """Inputs of two dtypes from the shape's expressions, the same for the same seed, each distribution's range; the
    output's shape from its own expression (tools/signature.py bind)."""
    from tools.signature import bind
    (tmp_path / "task.toml").write_text('device = "cpu"\nsources = []\n[signature]\nfunction = "f"\nreference = "m:f"\n'
                                        'args = [{ name = "x", kind = "input", dtype = "float32", shape = ["M", "N"] }, '
                                        '{ name = "h", kind = "input", dtype = "int64", shape = ["N"] },'
                                        ' { name = "o", kind = "output", dtype = "float64", shape = ["M"] }]\n')
    make_inputs, _, _, empty_output, _ = bind(str(tmp_path / "task.py"))
    x, h = make_inputs({"M": 3, "N": 5}, 7, "cpu", "normal")
    assert x.shape == (3, 5) and x.dtype.is_floating_point and h.shape == (5,) and int(h.abs().max()) <= 8
    o = empty_output({"M": 3, "N": 5}, x, h)
    assert o.shape == (3,) and str(o.dtype) == "torch.float64"
    a, _ = make_inputs({"M": 8, "N": 8}, 3, "cpu", "uniform")
    b, _ = make_inputs({"M": 8, "N": 8}, 3, "cpu", "uniform")
    assert bool((a == b).all()) and float(a.abs().max()) <= 1.0


SCALE_CU = """#include <cuda_runtime.h>
#define THREADS 256
__global__ void scale_kernel(const float* x, float* y, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
// the host function the generated task.py calls: the caller's stream, the CUDA error as the answer
extern "C" int scale(const float* x, float* y, int n, float a, cudaStream_t stream) {
    scale_kernel<<<(n + THREADS - 1) / THREADS, THREADS, 0, stream>>>(x, y, n, a);
    return (int)cudaGetLastError();
}
"""


@pytest.mark.nvcc
def test_a_cuda_host_function_with_a_stream_is_declared_and_its_task_compiles(tmp_path):
    """--cuda on this machine (no GPU): the stream parameter declared as the caller's stream, the task loads and nvcc
    builds it (compile-only: agent check needs a GPU to run it)."""
    from tools.build.build import build, find_nvcc
    from tools.results import BuildStatus
    from tools.task import load_task
    if find_nvcc() is None:
        pytest.skip("nvcc not installed")
    root = _user(tmp_path)
    (root / "src" / "scale.cu").write_text(SCALE_CU)
    (root / "ops" / "ref.py").write_text(REF + "\n\ndef scale(x, a=1.0):\n    return a * x\n")
    r = agent(root, "init", "scale", "--cuda", "src/scale.cu", "--reference", "ops.ref:scale", "--scalar", "a=2.0",
              "--knob", "THREADS=128,256,512", fresh=False)
    assert r.returncode == 0, r.stderr + r.stdout
    task = load_task(root / "kernels" / "scale")
    assert task.spec.device == "cuda" and [(a.name, a.kind) for a in task.spec.signature.args] == [
        ("x", "input"), ("y", "output"), ("n", "int"), ("a", "float"), ("stream", "stream")]
    res = build(task, tmp_path / "build")
    assert res.status == BuildStatus.ok, res.message
    assert [k.name.split("(")[0] for k in res.kernels] == ["scale_kernel"]


@pytest.mark.slow
def test_init_with_a_kernelbench_file_is_the_import(tmp_path):
    """README: `agent init NAME --kernelbench problem.py` is `agent import kernelbench problem.py --name NAME`."""
    from tests.userrepo import REPO
    root = _user(tmp_path)
    r = agent(root, "init", "ew", "--kernelbench", str(REPO / "tests" / "data" / "kernelbench" / "ew_problem.py"),
              timeout=600, fresh=False)
    assert r.returncode == 0, r.stderr + r.stdout
    meta = json.loads((root / "kernels" / "ew" / "kernelbench.json").read_text())
    assert tomllib.loads((root / "kernels" / "ew" / "task.toml").read_text())["name"] == "ew" and meta["kernel"]


def test_the_prototype_is_read_by_a_parser():
    """Issue 65: [signature] is checked against the function's prototype before every build. A parser reads it as the
    compiler does: a helper of the same name in a namespace before the extern "C" one (a regular expression took the
    first `fma(`), a function-pointer parameter (it stopped at the first ')'), comments, __restrict__, a default, a
    declaration in an extern "C" block before the definition."""
    from tools.signature import prototype, returns
    two = 'namespace detail { static void fma(int n) {} }\nextern "C" void fma(const float* x, float* out, int n) {}'
    assert [(p["type"], p["pointer"], p["const"], p["name"]) for p in prototype(two, "fma")] == [
        ("float", True, True, "x"), ("float", True, False, "out"), ("int", False, False, "n")]
    fnptr = 'extern "C" void apply(float* y, int n, float (*op)(float)) {}'
    assert [p["name"] for p in prototype(fnptr, "apply")] == ["y", "n", "op"]
    multi = ('extern "C" cudaError_t scale(const float* __restrict__ x, // the input, read once\n'
             '    float* __restrict__ y, /* the output */ int n, float a = 2.f, cudaStream_t stream = 0) { return 0; }')
    assert [(p["type"], p["pointer"], p["const"]) for p in prototype(multi, "scale")] == [
        ("float", True, True), ("float", True, False), ("int", False, False), ("float", False, False),
        ("cudaStream_t", False, False)]
    assert returns(multi, "scale") == "cudaError_t"
    block = 'extern "C" {\nint rows(const double* a, int64_t M);\n}\nint rows(const double* a, int64_t M) { return 0; }'
    assert [p["type"] for p in prototype(block, "rows")] == ["double", "int64_t"] and returns(block, "rows") == "int"
    assert prototype('extern "C" int g(void) { return 0; }', "g") == []
    assert prototype("// fma(int n) is not here\nvoid other(int n) {}", "fma") is None

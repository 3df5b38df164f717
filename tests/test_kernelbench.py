"""`agent import kernelbench` (issue 45): KernelBench problem and solution files written for these tests in its
format (tests/data/kernelbench/, none copied from KernelBench), imported through the real CLI into a user's git
repository outside this project, then checked with `agent check`. Bad files: one line naming the file, the field
and the fix, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.userrepo import agent, fast_bench, git

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
# the run's one object cache (tests/conftest.py): no test here counts compiles, and the elementwise problem's binding is
# the same bytes in several of them
pytestmark = pytest.mark.shared_objects


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "user"
    root.mkdir()
    (root / "README.md").write_text("a user's project\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user: initial")
    return root


def _status(root: Path) -> str:
    return git(root, "status", "--porcelain", "--untracked-files=all")


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.parametrize("problem, solution, field", [
    ("bad_syntax_problem.py", None, "bad_syntax_problem.py: line 10: syntax error"),
    ("bad_noinputs_problem.py", None, "bad_noinputs_problem.py: get_inputs: the problem defines no get_inputs"),
    ("ew_problem.py", "mm_problem.py", "mm_problem.py: ModelNew: the solution defines no ModelNew"),
    ("ew_problem.py", "no_such_file.py", "no_such_file.py: --solution: no such file"),
    pytest.param("bad_needs_gpu_problem.py", None, "bad_needs_gpu_problem.py: Model: needs a GPU and this machine has none",
                 marks=pytest.mark.skipif(_has_gpu(), reason="a GPU is here: the problem imports")),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, problem, solution, field):
    root = _repo(tmp_path)
    args = ["import", "kernelbench", str(DATA / problem), *(["--solution", str(DATA / solution)] if solution else [])]
    r = agent(root, *args, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert field in " ".join(r.stderr.split()), r.stderr
    assert "fix" in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert _status(root) == "" and not (root / "kernels").exists()


def test_probe_reads_sizes_shapes_and_the_solution(tmp_path):
    from tools.isolation.sandbox import run_python_json
    res, d = run_python_json("tools.kernelbench.probe", [str(DATA / "fuse_problem.py"), "--solution",
                                                          str(DATA / "fuse_cuda.py"), "--scale", "0.5"], 120)
    assert d and d["ok"], res.stdout + res.stderr
    assert d["sizes"] == {"batch_size": 128, "in_features": 512, "out_features": 256}
    assert d["shapes"][0] == {"batch_size": 64, "in_features": 256, "out_features": 128}      # --scale 0.5
    assert len(d["shapes"]) == 3 and all(v % 2 == 1 for v in d["shapes"][1].values())      # odd sizes
    assert d["output"] == {"dtype": "float32", "shape": [64, 128]}
    assert d["device"] == "cuda" and d["solution"]["functions"] == ["linear_relu_forward"]
    assert "__global__" in d["solution"]["cuda_sources"]


def _load_inline_flags(extra: list[str]) -> list[str]:
    """What torch's own writer gives the C++ compiler for a CPU load_inline module, without its folders and the module's
    name: asked of torch here, as KernelBench's build asks it."""
    import shlex
    import tempfile

    from torch.utils import cpp_extension as ce
    with tempfile.TemporaryDirectory() as d:
        ce._write_ninja_file_to_build_library(path=f"{d}/build.ninja", name="m", sources=[f"{d}/main.cpp"],
                                              extra_cflags=extra, extra_cuda_cflags=[], extra_sycl_cflags=[],
                                              extra_ldflags=[], extra_include_paths=[], with_cuda=False,
                                              with_sycl=False, is_standalone=False)
        line = next(ln for ln in Path(d, "build.ninja").read_text().splitlines() if ln.startswith("cflags = "))
    words = shlex.split(line[len("cflags = "):])
    return [w for i, w in enumerate(words) if w != "-isystem" and (i == 0 or words[i - 1] != "-isystem")
            and not w.startswith("-DTORCH_EXTENSION_NAME=")]


@pytest.mark.parametrize("solution, extra", [("ew_cpu.py", []), ("ew_cpu_unroll.py", ["-O3", "-march=native"])])
def test_an_imported_cpu_solution_is_compiled_with_the_flags_kernelbench_builds_it_with(tmp_path, solution, extra):
    """What is timed is what KernelBench times: the imported task's C++ flags are load_inline's own (torch's -fPIC and
    -std, no -O unless the solution's extra_cflags say so; no -march=native, no define torch's build does not pass),
    then the solution's extra_cflags, compared flag for flag with what torch's writer gives the same solution. Before,
    every imported solution was compiled with the agent's -O3 -march=native -std=c++17 and exported to a -O0 build."""
    from tools.build.build import cxx_flags_of
    from tools.task import load_task
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / "ew_problem.py"), "--solution", str(DATA / solution),
              "--name", "ew", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    task = load_task(root / "kernels" / "ew")
    assert task.spec.build.defaults == "load_inline" and task.spec.build.flags == extra
    ours = cxx_flags_of(task, task.root, None)
    theirs = _load_inline_flags(extra)
    assert [f for f in ours if not f.startswith("-DTORCH_EXTENSION_NAME=") and f != "-isystem"
            and not Path(f).is_absolute() and not f.startswith("-I")] == theirs
    assert ("-march=native" in ours) == bool(extra) and ours[-len(extra) or len(ours):] == extra
    if extra:   # the flags a torch extension of the agent's own gets: one precompiled torch/extension.h for both
        from tools.backends.pch import pch_flags
        ext = load_task(Path(__file__).resolve().parents[1] / "kernels" / "matmul_ext_cpu")
        assert pch_flags(cxx_flags_of(ext, ext.root, None), ext.root) == pch_flags(ours, task.root)


def test_a_forward_that_reads_tensor_values_gets_one_line(tmp_path):
    """Shapes are tried on torch's meta device, where a forward that branches on a tensor's value cannot run: one line
    says so (not a traceback, not a misleading 'fails at its sizes')."""
    bad = tmp_path / "branchy_problem.py"
    bad.write_text((DATA / "ew_problem.py").read_text().replace(
        "        return x * y + y", "        if x.sum() > 0:\n            return x * y + y\n        return x - y"))
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(bad), timeout=300)
    assert r.returncode == 2 and "reads tensor values in Python" in r.stderr and "fix" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and _status(root) == ""


def test_the_scaffold_writes_aten_calls_in_schema_order():
    """torch.export's graph as C++: positional arguments, a keyword argument after defaults it skips (filled from the
    schema), ints, lists and strings as C++ values."""
    import torch

    from tools.kernelbench.scaffold import forward_source

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(torch.sum(x, dim=[1], keepdim=True), approximate="tanh") * 2

    x = torch.randn(4, 6)
    ep = torch.export.export(M(), (x,), dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},))
    src, args = forward_source(ep)
    assert args == [("input", "x")]
    assert "at::sum(v_x, std::vector<int64_t>{int64_t(1)}, true);" in src
    assert 'at::gelu(v_sum_1, "tanh")' in src and "at::mul(v_gelu, int64_t(2))" in src, src


def test_cpu_machine_shrinks_sizes_it_cannot_run(tmp_path):
    """A problem at sizes a CPU cannot time (a 1024^3 matmul is about 2 GFLOP a call) is benched at smaller ones, said so."""
    big = tmp_path / "big_mm.py"
    big.write_text((DATA / "mm_problem.py").read_text().replace("M = 256", "M = 2048").replace("K = 384", "K = 2048")
                   .replace("N = 320", "N = 2048"))
    from tools.isolation.sandbox import run_python_json
    _, d = run_python_json("tools.kernelbench.probe", [str(big), "--no-gpu"], 200)
    assert d and d["ok"]
    main = d["shapes"][0]
    assert main["M"] * main["K"] * main["N"] < 2048 ** 3 and "on one CPU thread" in d["note"], d


@pytest.mark.slow
def test_import_optimize_export_and_the_export_matches_in_a_fresh_process(tmp_path):
    """The whole door on the CPU: a solution with a tunable #define imported with --knob, checked, optimized by the
    heuristic (1 iteration: the knob moved), its best exported as a ModelNew file that a fresh process builds and finds
    equal to Model. Over 60 s on 2 cores, and it cannot share: three builds of the solution's file, which includes
    torch's headers (check, the run's initial kernel, the candidate; about 11 s each with the precompiled header),
    and the export's own build in a fresh process (torch's load_inline, about 8 s with the run's precompiled header)."""
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / "ew_problem.py"), "--solution", str(DATA / "ew_cpu_unroll.py"),
              "--name", "ew", "--knob", "UNROLL=1,2,4,8", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    task = root / "kernels" / "ew"
    assert sorted(p.name for p in task.iterdir()) == ["binding.cpp", "kernel.cpp", "kernelbench.json", "model_new.py",
                                                       "problem.py", "task.py", "task.toml"]
    assert 'name = "UNROLL"' in (task / "task.toml").read_text()
    assert json.loads((task / "kernelbench.json").read_text())["argument"] == "cpp_sources"
    # load_inline's main.cpp: one translation unit with the solution's cpp_sources (kernel.cpp, the file edited)
    binding = (task / "binding.cpp").read_text()
    assert '#include "kernel.cpp"' in binding and 'm.def("fma_forward", torch::wrap_pybind_function(fma_forward)' in binding
    fast_bench(task)           # a test of the door, not of a speed: the loop tests' bench (tests/userrepo.py)
    r = agent(root, "check", "kernels/ew", timeout=600)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    # 3 listed x 2 distributions, 2 value draws, 2 misaligned views
    assert "10 checks on 5 shapes" in " ".join(r.stdout.split()), r.stdout[-3000:]
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user: the imported task")
    r = agent(root, "optimize", "kernels/ew", "--iters", "1", "--run-id", "kb", "--target", "100x", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "UNROLL" in r.stdout
    out = tmp_path / "exported.py"
    r = agent(root, "export", "kb", "--kernelbench", str(out), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("# Exported by `agent export kb --kernelbench`") and "load_inline(" in text
    assert "checked in a fresh process" in r.stdout and "trials match Model" in r.stdout
    assert _status(root) == ""                       # the user's checkout untouched by the run and the export
    r = agent(root, "export", "kb", "--kernelbench", str(out), timeout=60)
    assert r.returncode == 2 and "exists" in r.stderr     # never over a file without --force


def test_export_splices_the_kernel_where_the_author_bound_it():
    from tools.kernelbench.export import splice
    src = (DATA / "ew_cuda.py").read_text()
    out = splice(src, "cuda_sources", "// new kernel \"\"\" with quotes\n__global__ void k() {}\n", "# header\n")
    import ast
    tree = ast.parse(out)
    assert out.startswith("# header\n") and out.count("load_inline(") == src.count("load_inline(")
    consts = [n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]
    assert "// new kernel \"\"\" with quotes\n__global__ void k() {}\n" in consts     # bound where the author bound it
    assert out.splitlines()[-5:] == src.splitlines()[-5:]                 # the rest byte for byte


def _gpu() -> bool:
    from tools.backends.device import torch_cuda_available
    return torch_cuda_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_a_default_stream_cuda_solution_passes_check(tmp_path):
    """KernelBench's solutions launch with <<<grid, block>>> on the legacy default stream; the reentrancy probe's
    threads are on blocking streams, which order themselves with it (on torch's non-blocking streams this honest
    kernel was refused: a thread's copy of the output ran before the kernel, H100, 2026-11-28)."""
    root = _repo(tmp_path)
    assert "(blocks), THREADS>>>" in (DATA / "ew_cuda.py").read_text()      # no stream argument: stream 0
    r = agent(root, "import", "kernelbench", str(DATA / "ew_problem.py"), "--solution", str(DATA / "ew_cuda.py"),
              "--name", "ew", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = agent(root, "check", "kernels/ew", timeout=600)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout[-3000:]


def _refused_at(tmp_path: Path, adversary: str, stage: str) -> None:
    """An adversarial solution of the elementwise problem imported (it imports: it is a well-formed solution) and
    refused by `agent check` at `stage`. Named as the other tests name the problem: its binding (the problem's, 8-15 s
    of torch's headers) is then the same bytes under the same module name, built once for the run (shared_objects)."""
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / "ew_problem.py"), "--solution", str(DATA / f"{adversary}.py"),
              "--name", "ew", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = agent(root, "check", "kernels/ew", timeout=600)
    assert r.returncode != 0 and stage in r.stdout, r.stdout[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("adversary, stage", [("adv_uninit", "mismatch"), ("adv_zero_inputs", "input_mutated"),
                                              ("adv_stream", "scan_rejected")])
def test_kernelbench_reward_hacks_are_refused_at_their_stage(tmp_path, adversary, stage):
    _refused_at(tmp_path, adversary, stage)


@pytest.mark.slow
def test_without_a_solution_the_forward_is_scaffolded_and_checks(tmp_path):
    """A problem with parameters (Linear + ReLU) and no solution: the starting kernel is its forward as ATen calls,
    ModelNew subclasses Model (the same seeded parameters), and `agent check` passes it."""
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / "fuse_problem.py"), "--name", "fuse", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    task = root / "kernels" / "fuse"
    kernel = (task / "kernel.cpp").read_text()
    assert "at::linear(" in kernel and "at::relu(" in kernel
    assert "class ModelNew(Model):" in (task / "model_new.py").read_text()
    r = agent(root, "check", "kernels/fuse", timeout=600)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("adversary, stage", [("adv_uninit_cpu", "mismatch"), ("adv_zero_inputs_cpu", "input_mutated")])
def test_kernelbench_reward_hacks_on_the_cpu(tmp_path, adversary, stage):
    """The two of KernelBench's published hacks a CPU solution can play: an output never written (torch::empty_like:
    the reference's answer is in another process here, never in reach of the allocator) and inputs zeroed in place."""
    _refused_at(tmp_path, adversary, stage)


def test_check_says_where_a_cuda_solution_launches_on_the_legacy_stream(tmp_path):
    """Said, not refused (on any machine: it reads the source): ew_cuda's launch names no stream, softmax_cuda's does."""
    from tools.backends.cu_scan import default_stream_launches
    assert default_stream_launches("void f() {\n k<<<dim3(1, 2), 32>>>(a);\n k<<<g, b, 0, s>>>(a);\n"
                                   " k<<<g, b, smem, 0>>>(x);\n}\n") == [2, 4]
    root = _repo(tmp_path)
    for name, solution, problem in (("ew", "ew_cuda.py", "ew_problem.py"), ("sm", "softmax_cuda.py", "softmax_problem.py")):
        r = agent(root, "import", "kernelbench", str(DATA / problem), "--solution", str(DATA / solution), "--name", name,
                  timeout=300)
        assert r.returncode == 0, r.stderr
        if name == "ew":
            # built for the generic target, as load_inline builds it (issue 63: the agent's own tasks get sm_90a)
            from tools.backends.device import resolve_arch
            from tools.task import load_task
            task = load_task(root / "kernels" / name)
            assert task.spec.build.arch_specific is False and not resolve_arch(task).endswith("a")
        r = agent(root, "check", f"kernels/{name}", timeout=300)
        text = " ".join(r.stdout.replace("│", " ").split())      # the table's wrapped cells as one line
        assert ("legacy default stream" in text) == (name == "ew"), text[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["mm", "rowred", "fuse"])
def test_each_problem_goes_in_and_out(tmp_path, problem):
    """The other problem files with their CPU solutions: imported, through `agent optimize`'s initial check (build,
    parity, bench: no knob to move, so the run ends there), exported, the export built in a fresh process and equal to
    Model (the elementwise one goes the whole way with a knob above)."""
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / f"{problem}_problem.py"), "--solution",
              str(DATA / f"{problem}_cpu.py"), "--name", problem, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    fast_bench(root / "kernels" / problem)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user: the imported task")
    r = agent(root, "optimize", f"kernels/{problem}", "--iters", "1", "--run-id", "kb", timeout=900)
    assert r.returncode == 0 and "initial:" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-2000:]
    out = tmp_path / f"{problem}_new.py"
    r = agent(root, "export", "kb", "--kernelbench", str(out), timeout=900)
    assert r.returncode == 0 and "trials match Model" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


FUSED = """    TORCH_CHECK(v_x.is_contiguous() && v_y.is_contiguous() && v_x.scalar_type() == at::kFloat &&
                v_y.scalar_type() == at::kFloat, "forward: contiguous float32 inputs");
    auto out = at::empty_like(v_x);
    const float* __restrict__ x = v_x.data_ptr<float>();
    const float* __restrict__ y = v_y.data_ptr<float>();
    float* __restrict__ o = out.data_ptr<float>();
    const int64_t n = v_x.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i] + y[i];
    return out;"""


def _llm_proposal(hyp: str, search: str, replace: str | None = None, content: str | None = None) -> dict:
    edit = {"file": "kernel.cpp", "search": search, "replace": replace} if content is None else \
        {"file": "kernel.cpp", "content": content}
    return {"hypothesis": hyp, "evidence": [{"metric": "source", "value": "two ATen calls, two passes"}],
            "predicted": {"metric": "time.median_ms", "direction": "down", "speedup": 1.5}, "edits": [edit]}


@pytest.mark.slow
def test_a_model_takes_the_scaffold_from_there(tmp_path):
    """The scaffolded elementwise problem (no solution) optimized by a model (a scripted endpoint, through the real
    client): iteration 1 replaces the two ATen calls with one fused loop (real code); iteration 2 rewrites the file
    with that loop unrolled by 8 and the tail dropped, a model's accident, refused by parity on the odd shape whether
    or not iteration 1 was kept; the best is exported and checked. Over 60 s on 2 cores, and it cannot share: four
    builds of a file that includes torch's headers (the initial kernel and two candidates, about 11 s each with the
    precompiled header) and the export's own build in a fresh process (about 8 s with the run's precompiled header,
    torch's load_inline as KernelBench builds it), each of this test's own sources."""
    from tests.fake_openai import FakeOpenAI
    from tests.userrepo import configure_llm
    root = _repo(tmp_path)
    r = agent(root, "import", "kernelbench", str(DATA / "ew_problem.py"), "--name", "ew", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    aten = "    auto v_mul = at::mul(v_x, v_y);\n    auto v_add = at::add(v_mul, v_y);\n    return v_add;"
    scaffold = (root / "kernels" / "ew" / "kernel.cpp").read_text()
    assert aten in scaffold
    fast_bench(root / "kernels" / "ew")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user: the imported task")
    loop = "    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i] + y[i];"
    unrolled = ("    for (int64_t i = 0; i + 8 <= n; i += 8)\n"
                "        for (int u = 0; u < 8; ++u) o[i + u] = x[i + u] * y[i + u] + y[i + u];")
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url)
        srv.push_proposal(_llm_proposal("fuse the multiply and the add into one pass over the data", aten, FUSED))
        # a whole-file rewrite: it applies on the scaffold and on iteration 1's loop alike
        srv.push_proposal(_llm_proposal("unroll by 8 for wider vector code", "",
                                        content=scaffold.replace(aten, FUSED.replace(loop, unrolled))))
        r = agent(root, "optimize", "kernels/ew", "--proposer", "llm", "--iters", "2", "--repairs", "0", "--run-id",
                  "kbllm", "--target", "100x", timeout=900, env={"AGENT_API_KEY": "sk-test"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    from agent.records.store import read_iterations
    its = read_iterations(root / "runs" / "kbllm")
    assert its[0].outcome.value in ("kept", "not_faster", "inconclusive"), its[0]   # built and passed parity either way
    assert its[0].parity is not None and its[0].parity.status.value == "ok", its[0].parity
    # the unrolled loop drops the tail: parity's odd shape (131 x 67 elements, not a multiple of 8) refuses it
    assert its[1].outcome.value == "parity_failed", (its[1].outcome, its[1].reason)
    out = tmp_path / "ew_new.py"
    r = agent(root, "export", "kbllm", "--kernelbench", str(out), timeout=900)
    assert r.returncode == 0 and "trials match Model" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    if its[0].outcome.value == "kept":
        assert "o[i] = x[i] * y[i] + y[i]" in out.read_text()

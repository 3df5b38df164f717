"""Kernels as the user has them: PyTorch C++ extensions (form = "torch_extension", tools/backends/backend.py).

Real builds with torch's headers (about 25 s per file that includes them, on one core), real judge
and host processes, and, end to end, a user's own git repository outside this project holding a
single-file extension written the way `torch.utils.cpp_extension.load` takes it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from agent.records.schema import Decision
from agent.records.store import read_iterations, read_state
from tests.userrepo import REPO, agent, fast_bench, git, snapshot
from tools.build.build import build
from tools.measure.parity import run_parity
from tools.results import BuildStatus, ParityStatus
from tools.task import TaskError, load_task

SHIPPED = REPO / "kernels" / "matmul_ext_cpu"


def _copy(tmp: Path) -> Path:
    dst = tmp / "matmul_ext_cpu"
    shutil.copytree(SHIPPED, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_an_extension_table_needs_the_extension_form(tmp_path):
    task = _copy(tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('form = "torch_extension"\n', ""))
    with pytest.raises(TaskError) as e:
        load_task(task)
    assert 'is for form = "torch_extension"' in str(e.value) and str(toml) in str(e.value)
    t = load_task(SHIPPED)
    assert (t.backend.name, t.spec.ext.name, t.spec.ext.entry) == ("torch_extension-cpu", "matmul_ext_cpu_ext", "forward")


def test_an_extension_without_a_pybind11_module_is_one_line_naming_the_fix(tmp_path):
    task = _copy(tmp_path)
    binding = task / "binding.cpp"
    text = binding.read_text()
    start = text.index("PYBIND11_MODULE")
    binding.write_text(text[:start] + 'TORCH_LIBRARY(mymm, m) { m.def("forward", &forward); }\n')
    with pytest.raises(TaskError) as e:          # taken, with the op named (tests/test_torch_library.py)
        load_task(task)
    assert str(e.value) == (f"{task / 'task.toml'}: extension.entry: binding.cpp registers its ops with "
                            'TORCH_LIBRARY(mymm, m) and defines no Python module: set [extension] entry = '
                            '"mymm::forward", the op to call (torch.ops.mymm.forward)')
    binding.write_text(text[:start])
    with pytest.raises(TaskError, match="sources: no source defines the extension's Python module or registers an op: "
                                        "add PYBIND11"):
        load_task(task)


def test_torchs_headers_in_an_editable_file_get_a_note_a_split_extension_none(tmp_path):
    from tools.backends.backend import slow_rebuild_note
    assert slow_rebuild_note(load_task(SHIPPED)) is None
    assert slow_rebuild_note(load_task(REPO / "kernels" / "attention_ext")) is None
    assert slow_rebuild_note(load_task(REPO / "kernels" / "matmul_cpu")) is None      # not an extension
    task = _copy(tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('editable = ["matmul.cpp"]', 'editable = ["matmul.cpp", "binding.cpp"]'))
    note = slow_rebuild_note(load_task(task))
    assert note.startswith("binding.cpp is editable and includes torch's headers") and "matmul.cpp" not in note


@pytest.fixture(scope="session")
def built(tmp_path_factory, torch_pch):
    """The shipped split extension built once a worker (binding.cpp is the slow file, 27-30 s on 2 cores; it takes
    the run's cached precompiled header, tests/conftest.py). Session-scoped, not module-scoped: the full suite's
    order (tests/conftest.py, the slow tests first in each worker's share) and work stealing put other files' tests
    between this file's, and pytest tears a module fixture down at each such switch: it was built three times in one
    run. The tests read it; the edit test's rebuild in its folder leaves the binding object as it was."""
    tmp = tmp_path_factory.mktemp("ext")
    src = _copy(tmp)
    task = load_task(src)
    # an object cache of its own, as each test has (tests/conftest.py own_object_cache): a session fixture is made before
    # that function-scoped one, so it would take the run's shared cache, where the other worker's build of the same
    # binding may already be; then this build links it from there, and the edit test's rebuild (its own empty cache)
    # compiles the binding it expects kept: 3 steps, not 2, depending on the other worker's timing
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENT_OBJECT_CACHE", str(tmp / "objects"))
        res = build(task, tmp / "build", src_dir=src)
    assert res.status == BuildStatus.ok, res.message
    lib = tmp / "honest.so"          # the build folder's library is rebuilt by the edit test
    shutil.copy(res.lib_path, lib)
    return task, src, tmp / "build", res.model_copy(update={"lib_path": str(lib)})


@pytest.mark.slow
def test_a_kernel_edit_recompiles_only_the_kernel_and_both_builds_load_side_by_side(built, torch_pch, tmp_path):
    import torch
    task, src, build_dir, first = built
    kept = Path(first.lib_path)
    kernel = src / "matmul.cpp"
    text = kernel.read_text()
    try:
        kernel.write_text(text.replace("acc += A", "acc += 2 * A"))    # a one-line edit: twice the product
        again = build(task, build_dir, src_dir=src)
    finally:
        kernel.write_text(text)
    assert again.status == BuildStatus.ok, again.message
    assert again.steps_run == 2, again.log        # matmul.cpp and the link; binding.cpp not recompiled
    assert "== binding.cpp (cached)" in again.log and "== matmul.cpp (compiled)" in again.log
    if torch_pch is not None:     # the binding (not editable) took the cached header: gcc read none of torch's
        from tools.build.build import obj_name
        from tools.backends.toolchain import find_ninja
        deps = subprocess.run([find_ninja(), "-C", str(build_dir), "-t", "deps", obj_name("binding.cpp")],
                              capture_output=True, text=True, timeout=60).stdout
        assert "(VALID)" in deps and "torch/" not in deps and f"pch = -I{torch_pch}" in \
            (build_dir / "build.ninja").read_text(), deps[:2000]
    # the best and the candidate, one extension name, in one process (as the host holds them)
    be = task.backend
    best, cand = be.load(str(kept)), be.load(again.lib_path)
    x = torch.ones(4, 4)
    assert best.forward(x, x)[0, 0].item() == 4.0 and cand.forward(x, x)[0, 0].item() == 8.0


@pytest.mark.slow
def test_a_configuration_links_the_earlier_builds_binding_and_is_still_its_own(built, tmp_path):
    """The sweep's reuse: another configuration of the kernel, built beside the first, links the
    first build's binding object instead of compiling torch's headers again."""
    import torch
    task, src, build_dir, _ = built
    cfg = tmp_path / "cfg"
    shutil.copytree(src, cfg)
    kernel = cfg / "matmul.cpp"
    kernel.write_text(kernel.read_text().replace("#define LOOP_ORDER 0", "#define LOOP_ORDER 1", 1))
    res = build(load_task(cfg), tmp_path / "b", src_dir=cfg, reuse=build_dir)
    assert res.status == BuildStatus.ok, res.message
    assert res.steps_run == 2 and f"== binding.cpp (reused: {(build_dir / 'obj' / 'binding.cpp.o').resolve()})" \
        in res.log, res.log
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    got = load_task(cfg).backend.load(res.lib_path).forward(a, b)
    assert torch.allclose(got, a @ b, atol=1e-5)


@pytest.mark.slow
def test_a_binding_that_includes_an_editable_file_is_reused_only_while_that_file_has_the_same_bytes(tmp_path, torch_pch):
    from tools.build.build import obj_name
    from tools.build.reuse import reusable_objects
    from tools.backends.toolchain import find_ninja
    src = _copy(tmp_path)
    (src / "tiles.h").write_text("#define TILE_NOTE 1\n")
    # included after torch's header, so that the binding still takes the run's precompiled one (12 s, not 25)
    text = (src / "binding.cpp").read_text()
    assert text.count("#include <torch/extension.h>\n") == 1
    (src / "binding.cpp").write_text(text.replace("#include <torch/extension.h>\n",
                                                  '#include <torch/extension.h>\n#include "tiles.h"\n'))
    toml = src / "task.toml"
    toml.write_text(toml.read_text().replace('sources = ["binding.cpp", "matmul.cpp"]',
                                             'sources = ["binding.cpp", "matmul.cpp", "tiles.h"]')
                    .replace('editable = ["matmul.cpp"]', 'editable = ["matmul.cpp", "tiles.h"]'))
    task = load_task(src)
    assert build(task, tmp_path / "b").status == BuildStatus.ok
    objects = {f: obj_name(f) for f in ("binding.cpp", "matmul.cpp")}
    # the same bytes everywhere (a run's first build after agent check): both linked
    assert set(reusable_objects(task, tmp_path / "b", find_ninja(), objects)) == {"binding.cpp", "matmul.cpp"}
    # the editable header edited (a candidate's change): the binding that includes it is compiled again
    (src / "tiles.h").write_text("#define TILE_NOTE 2\n")
    assert set(reusable_objects(task, tmp_path / "b", find_ninja(), objects)) == {"matmul.cpp"}
    # the same names, other bytes (the shipped task's binding.cpp has no #include "tiles.h"): not reused
    assert "binding.cpp" not in reusable_objects(load_task(SHIPPED), tmp_path / "b", find_ninja(), objects)
    assert reusable_objects(task, tmp_path / "nothing here", find_ninja(), objects) == {}


@pytest.mark.slow
def test_agent_sweep_of_an_extension_compiles_the_binding_once(tmp_path, torch_pch):
    root = tmp_path / "repo"
    shutil.copytree(SHIPPED, root / "kernels" / "matmul_ext_cpu", ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "task")
    res = agent(root, "sweep", "kernels/matmul_ext_cpu", "--limit", "3", "--seed", "2", "--jobs", "2", "--json",
                timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert len(out["points"]) == 3 and all(p["ok"] for p in out["points"]), out["points"]
    assert any(p["verified"] for p in out["points"])
    [sweep_dir] = (root / "runs").glob("sweep-*")
    # each configuration's build linked the initial build's binding: one binding object in the sweep
    assert [p.name for p in sweep_dir.rglob("binding.cpp.o")] == ["binding.cpp.o"]


def _task_with(built, tmp_path, toml_from=None, py_from=None) -> Path:
    task, src, _, res = built
    dst = tmp_path / "t"
    shutil.copytree(src, dst)
    if toml_from:
        (dst / "task.toml").write_text(toml_from((dst / "task.toml").read_text()))
    if py_from:
        (dst / "task.py").write_text(py_from((dst / "task.py").read_text()))
    return dst


@pytest.mark.slow
def test_a_misnamed_entry_is_one_line_naming_the_field_and_the_fix(built, tmp_path):
    _, _, _, res = built
    dst = _task_with(built, tmp_path, toml_from=lambda t: t.replace('entry = "forward"', 'entry = "fwd"'))
    par = run_parity(load_task(dst), Path(res.lib_path), scratch_root=tmp_path / "scratch")
    assert par.status == ParityStatus.error
    assert f"{dst / 'task.toml'}: extension.entry: the module has no function 'fwd' (it has forward)" in par.message
    assert "Traceback" not in par.message


@pytest.mark.slow
def test_a_module_of_another_name_is_one_line_naming_the_field_and_the_fix(built, tmp_path):
    """PYBIND11_MODULE(some_literal, m) where the task expects another name: the build answers to the
    name it was given, the loader looks for another PyInit_."""
    _, _, _, res = built
    dst = _task_with(built, tmp_path, toml_from=lambda t: t.replace('[extension]\n', '[extension]\nname = "mymm"\n'))
    par = run_parity(load_task(dst), Path(res.lib_path), scratch_root=tmp_path / "scratch")
    assert par.status == ParityStatus.error
    assert (f"{dst / 'task.toml'}: extension.name: the module is not 'mymm': write "
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m), or set [extension] name") in par.message
    assert "Traceback" not in par.message


@pytest.mark.slow
def test_a_missing_header_is_a_compile_error_naming_the_file_and_line(built):
    task, src, build_dir, _ = built
    kernel = src / "matmul.cpp"
    text = kernel.read_text()
    try:
        kernel.write_text(text.replace("#define LOOP_ORDER", '#include "tiling.h"\n#define LOOP_ORDER', 1))
        line = kernel.read_text().splitlines().index('#include "tiling.h"') + 1
        res = build(task, build_dir, src_dir=src)
    finally:
        kernel.write_text(text)
    assert res.status == BuildStatus.compile_error
    first = res.message.splitlines()[0]
    assert first.startswith(f"matmul.cpp:{line}:") and "tiling.h" in first, res.message
    assert "Traceback" not in res.message


@pytest.mark.slow
def test_an_answer_of_the_wrong_shape_names_both_shapes(built, tmp_path):
    _, _, _, res = built
    dst = _task_with(built, tmp_path, py_from=lambda t: t.replace(
        'torch.empty(shape["M"], shape["N"],', 'torch.empty(shape["N"], shape["M"],'))
    par = run_parity(load_task(dst), Path(res.lib_path), hidden=False, scratch_root=tmp_path / "scratch")
    assert par.status != ParityStatus.ok
    assert "forward() returned float32 [64, 64]" not in par.message      # the square shape is not where it fails
    assert "forward() returned float32 [96, 160] on cpu; the task's output is float32 [160, 96]" in par.message
    assert "Traceback" not in par.message


# --- a user's own repository -------------------------------------------------------------------------
USER_EXT = """\
// y = A @ B for float32 matrices: my first kernel as a torch extension (cpp_extension.load(...)).
#include <torch/extension.h>

#define LOOP_ORDER 0   // 0: i-j-k, 1: i-k-j
#define BLOCK 16

torch::Tensor forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "shapes");
    auto A = a.contiguous(), B = b.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::zeros({M, N}, a.options());
    const float* pa = A.data_ptr<float>();
    const float* pb = B.data_ptr<float>();
    float* pc = C.data_ptr<float>();
    for (int i0 = 0; i0 < M; i0 += BLOCK)
        for (int k0 = 0; k0 < K; k0 += BLOCK)
            for (int i = i0; i < std::min(i0 + BLOCK, M); ++i)
#if LOOP_ORDER == 0
                for (int j = 0; j < N; ++j) {
                    float acc = pc[i * N + j];
                    for (int k = k0; k < std::min(k0 + BLOCK, K); ++k) acc += pa[i * K + k] * pb[k * N + j];
                    pc[i * N + j] = acc;
                }
#else
                for (int k = k0; k < std::min(k0 + BLOCK, K); ++k) {
                    const float s = pa[i * K + k];
                    for (int j = 0; j < N; ++j) pc[i * N + j] += s * pb[k * N + j];
                }
#endif
    return C;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "A @ B"); }
"""

USER_TASK_PY = """\
import torch


def make_inputs(shape, seed, device, dist):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape["M"], shape["K"], generator=g)
    b = torch.randn(shape["K"], shape["N"], generator=g)
    if dist == "uniform":
        a, b = a.sign() * a.abs().sqrt(), b.sign() * b.abs().sqrt()
    return a.to(device), b.to(device)


def reference(shape, a, b):
    return (a.double() @ b.double()).float()


def empty_output(shape, a, b):
    return torch.empty(shape["M"], shape["N"], device=a.device)
"""

USER_TOML = """\
name = "mymm"
device = "cpu"
form = "torch_extension"
sources = ["mymm.cpp"]
editable = ["mymm.cpp"]
baseline = "initial"
shapes = [{ M = 96, N = 160, K = 72 }, { M = 192, N = 192, K = 192 }, { M = 61, N = 67, K = 33 }]
main_shape = 1

[tolerance.float32]
atol = 1e-4
rtol = 1e-4

[[knobs]]
name = "LOOP_ORDER"
values = [0, 1]
default = 0
file = "mymm.cpp"
role = "order"

[[knobs]]
name = "BLOCK"
values = [8, 16, 32, 64]
default = 16
file = "mymm.cpp"
role = "tile"

[parity]
seeds = 1
hidden_shapes = 0

[bench]
warmup_ms = 5
rep_ms = 15
rounds = 6
input_sets = 1
"""


@pytest.mark.slow
def test_a_users_single_file_extension_in_their_own_repo_is_checked_and_optimized(tmp_path):
    """Over 60 s on 2 cores, and it cannot share: three builds of a file that includes torch's headers (the check's,
    whose object the run's initial build links, and two candidates; 20-28 s each with the precompiled header on the
    slower 2-core machine). It also holds what tests/test_pch.py's one-file build held (the .gch taken, a second
    include of torch/extension.h served by the stub), on the check's build rather than on one more of its own."""
    from tools.backends.pch import cache_root
    from tools.backends.toolchain import find_ninja
    from tools.build.build import obj_name
    root = tmp_path / "myproject"
    (root / "ext").mkdir(parents=True)
    # torch/extension.h included a second time (as a header of the user's that includes it too would): gcc opens the
    # header by the path it found the .gch at, so a file must be there (it failed with "No such file")
    text = USER_EXT.replace("#define LOOP_ORDER 0", "#include <torch/extension.h>\n#define LOOP_ORDER 0", 1)
    assert text.count("#include <torch/extension.h>") == 2
    (root / "ext" / "mymm.cpp").write_text(text)
    (root / "ext" / "task.py").write_text(USER_TASK_PY)
    (root / "ext" / "task.toml").write_text(textwrap.dedent(USER_TOML))
    (root / "README.md").write_text("my project\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "my kernel")
    (root / "README.md").write_text("my project\nwork in progress\n")     # uncommitted work of the user's
    before = snapshot(root)

    chk = agent(root, "check", "ext", timeout=900)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert "all checks passed" in chk.stdout
    checked = root / "runs" / "_build" / "mymm"
    assert (checked / "libmymm.so").is_file()     # the build is in the user's runs/
    # the file took the run's precompiled torch/extension.h (tools/backends/pch.py): gcc's own dependency list shows it
    # read none of torch's headers (without the .gch the list holds hundreds), only the two-line stub beside the .gch
    # that the second include opened (tools.backends.pch._stub); parity's pass above is the module computing A @ B
    log = (checked / "build.log").read_text()
    assert "== pch ==\nprecompiled torch/extension.h" in log and "invalid" not in log.split("== pch ==")[0], log[-2000:]
    assert "-Winvalid-pch" in (checked / "build.ninja").read_text()
    deps = subprocess.run([find_ninja(), "-C", str(checked), "-t", "deps", obj_name("mymm.cpp")],
                          capture_output=True, text=True, timeout=60).stdout
    assert "(VALID)" in deps and "mymm.cpp" in deps and len(deps.splitlines()) < 8, deps
    pch_root = cache_root() / "pch"
    assert all(Path(ln.strip()).is_relative_to(pch_root) for ln in deps.splitlines() if "torch/" in ln), deps

    # two iterations: the first move (LOOP_ORDER, the heuristic's first role on a CPU) is kept, the second
    # builds on the kept commit; each recompiles torch's headers (from the .gch), so more buy no behaviour
    res = agent(root, "optimize", "ext", "--target", "100x", "--iters", "2", "--quiet", timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    # the file the agent edits holds the binding too: the user is told why each build is slow, and the fix
    note = "mymm.cpp is editable and includes torch's headers: every candidate recompiles them"
    assert "note: " + note in " ".join((res.stdout + res.stderr).split())
    assert note in " ".join(re.sub("[│┃]", " ", chk.stdout).split())
    [run] = [p for p in (root / "runs").iterdir() if (p / "run.json").exists()]
    recs, state = read_iterations(run), read_state(run)
    assert len(recs) == 2 and state.status == "done"
    kept = [r for r in recs if r.decision == Decision.kept]
    assert kept, [(r.iteration, r.reason) for r in recs]                 # LOOP_ORDER 0->1 is several times faster
    for r in kept:
        assert r.parity.status == ParityStatus.ok and r.bench.speedup_vs_baseline.low > 1.0
        assert "LOOP_ORDER" in git(root, "show", r.commit_sha, "--", "ext/mymm.cpp") or \
               "BLOCK" in git(root, "show", r.commit_sha, "--", "ext/mymm.cpp")
    assert snapshot(root) == before


@pytest.mark.slow
def test_a_new_run_and_a_sweep_link_the_binding_agent_check_compiled(tmp_path, torch_pch):
    """The binding (torch's headers, 20-35 s) is compiled by `agent check`, and the run that follows
    links that object instead of compiling it again; the run's kernel is still its own build."""
    root = tmp_path / "proj"
    dst = root / "kernels" / "matmul_ext_cpu"
    shutil.copytree(SHIPPED, dst, ignore=shutil.ignore_patterns("__pycache__"))
    fast_bench(dst)            # a test of what is linked, not of a speed (tests/userrepo.py)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "kernel")
    chk = agent(root, "check", "kernels/matmul_ext_cpu", timeout=900)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    checked = root / "runs" / "_build" / "matmul_ext_cpu"
    res = agent(root, "optimize", "kernels/matmul_ext_cpu", "--target", "100x", "--iters", "1", "--quiet", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    [run] = [p for p in (root / "runs").iterdir() if (p / "run.json").exists()]
    log = (run / "build" / "build.log").read_text()
    assert f"== binding.cpp (reused: {(checked / 'obj' / 'binding.cpp.o').resolve()})" in log, log[-3000:]
    assert "== matmul.cpp (" in log and "(reused:" not in log.split("== matmul.cpp (")[1].split("\n")[0]
    assert [r.decision for r in read_iterations(run)] and read_state(run).status == "done"
    # a sweep after them compiles no binding at all: its initial build and every configuration link one
    sw = agent(root, "sweep", "kernels/matmul_ext_cpu", "--limit", "2", "--seed", "3", "--jobs", "2", "--json", timeout=900)
    assert sw.returncode == 0, sw.stdout[-3000:] + sw.stderr[-3000:]
    assert all(p["ok"] for p in json.loads(sw.stdout)["points"])
    [sweep_dir] = (root / "runs").glob("sweep-*")
    assert list(sweep_dir.rglob("binding.cpp.o")) == [], list(sweep_dir.rglob("binding.cpp.o"))
    assert "(reused:" in (sweep_dir / "build-initial" / "build.log").read_text()
